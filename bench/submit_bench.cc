// Submit throughput and latency against a running tallyd on loopback:
//   submit_bench --controller=HOST:PORT --clients=8 --seconds=5
// Prints one line: clients, submits, submits/s, p50 ms, p99 ms.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tally/v1/jobs.grpc.pb.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:50051", "tallyd address");
ABSL_FLAG(int, clients, 1, "concurrent clients, each with its own channel");
ABSL_FLAG(double, seconds, 5, "how long to submit");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients);
  const absl::Time until = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("bench.client", c);  // a channel (connection) per client
      auto stub = tally::v1::Jobs::NewStub(grpc::CreateCustomChannel(
          absl::GetFlag(FLAGS_controller), grpc::InsecureChannelCredentials(), args));
      tally::v1::SubmitJobRequest req;
      auto* spec = req.mutable_spec();
      spec->mutable_model()->set_num_layers(2);
      spec->mutable_model()->set_d_model(64);
      spec->mutable_model()->set_num_heads(4);
      spec->mutable_data()->set_train_path("/data/bench");
      spec->mutable_data()->set_seq_len(256);
      spec->mutable_training()->set_max_steps(100);
      spec->mutable_resources()->set_gpu_type("bench");  // never placed
      for (int i = 0; absl::Now() < until; ++i) {
        req.set_request_id(absl::StrCat("bench-", c, "-", i, "-", absl::ToUnixNanos(start)));
        tally::v1::Job job;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        const absl::Time t0 = absl::Now();
        grpc::Status s = stub->SubmitJob(&ctx, req, &job);
        if (!s.ok()) {
          ++errors;
          continue;
        }
        latencies[c].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, size_t(p * all.size()))];
  };
  std::printf("%d\t%zu\t%.0f\t%.2f\t%.2f\t%d\n", clients, all.size(), all.size() / elapsed,
              pct(0.50), pct(0.99), errors.load());
  return errors.load() ? 1 : 0;
}
