// CreateJob throughput of SqliteJobStore alone (no gRPC, no scheduler), at
// a number of concurrent writer threads: what group commit lets the store
// acknowledge, one fsync per batch.
//   store_bench --threads=64 --seconds=3 [--dir=/tmp]
// Prints one line: threads, creates, creates/s, p50 ms, p99 ms, batches,
// writes per batch.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/store/sqlite_job_store.h"

ABSL_FLAG(int, threads, 1, "concurrent writers");
ABSL_FLAG(double, seconds, 3, "how long to write");
ABSL_FLAG(std::string, dir, "", "where the database goes (default: the temp directory)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string parent = absl::GetFlag(FLAGS_dir);
  if (parent.empty()) parent = std::filesystem::temp_directory_path().string();
  std::string dir = parent + "/tally_store_bench_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    return 2;
  }
  auto opened = tally::store::SqliteJobStore::Open(dir + "/tally.db");
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
    return 2;
  }
  tally::store::SqliteJobStore& store = **opened;
  const int threads = absl::GetFlag(FLAGS_threads);
  const absl::Time start = absl::Now();
  const absl::Time until = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::vector<double>> latencies(threads);
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tally::store::JobRecord rec;
      rec.mutable_job()->set_state(tally::v1::JOB_STATE_QUEUED);
      rec.mutable_job()->mutable_spec()->mutable_model()->set_num_layers(2);
      rec.mutable_job()->mutable_spec()->mutable_data()->set_train_path("/data/bench");
      rec.mutable_job()->mutable_create_time()->set_seconds(absl::ToUnixSeconds(start));
      tally::v1::JobEvent first;
      first.set_type("submitted");
      first.set_state(tally::v1::JOB_STATE_QUEUED);
      for (int i = 0; absl::Now() < until; ++i) {
        rec.mutable_job()->set_request_id(absl::StrCat("bench-", t, "-", i));
        const absl::Time t0 = absl::Now();
        if (!store.CreateJob(rec, first).ok()) {
          ++errors;
          continue;
        }
        latencies[t].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
    });
  }
  for (auto& t : pool) t.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, size_t(p * all.size()))];
  };
  const auto stats = store.batch_stats();
  std::printf("%d\t%zu\t%.0f\t%.2f\t%.2f\t%lld\t%.1f\n", threads, all.size(),
              all.size() / elapsed, pct(0.50), pct(0.99), static_cast<long long>(stats.batches),
              stats.batches ? static_cast<double>(stats.writes) / stats.batches : 0.0);
  opened->reset();
  std::filesystem::remove_all(dir);
  return errors.load() ? 1 : 0;
}
