// Concurrent CreateJob throughput of PostgresJobStore, with and without group
// commit, against a throwaway loopback PostgreSQL (fsync on) or --dsn.
//
//   postgres_store_bench --threads=32 --seconds=5
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "server/store/postgres_job_store.h"
#include "tests/support/store/postgres_server.h"

ABSL_FLAG(int, threads, 32, "concurrent CreateJob callers");
ABSL_FLAG(int, seconds, 5, "seconds per run");
ABSL_FLAG(std::string, dsn, "", "PostgreSQL to use; empty: start a throwaway one");

namespace tally::store {
namespace {

int Run() {
  std::unique_ptr<testing::PostgresServer> server;
  const std::string dsn_flag = absl::GetFlag(FLAGS_dsn);
  if (dsn_flag.empty()) {
    auto s = testing::PostgresServer::Start();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    server = std::move(*s);
  }
  const int num_threads = absl::GetFlag(FLAGS_threads);
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (bool group_commit : {false, true}) {
    std::string dsn = dsn_flag;
    if (server != nullptr) {
      auto d = server->CreateDatabase();
      if (!d.ok()) {
        std::fprintf(stderr, "%s\n", std::string(d.status().message()).c_str());
        return 1;
      }
      dsn = *d;
    }
    auto store = PostgresJobStore::Open(dsn);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
      return 1;
    }
    (*store)->SetGroupCommit(group_commit);
    std::atomic<int64_t> num_ok{0}, num_failed{0};
    const absl::Time end = absl::Now() + duration;
    std::vector<std::thread> threads;
    for (int t = 0; t < num_threads; ++t) {
      threads.emplace_back([&] {
        JobRecord job;
        job.mutable_job()->set_state(tally::v1::JOB_STATE_QUEUED);
        job.mutable_job()->mutable_spec()->mutable_model()->set_num_layers(2);
        tally::v1::JobEvent event;
        event.set_type("submitted");
        while (absl::Now() < end) {
          if ((*store)->CreateJob(job, event).ok()) {
            ++num_ok;
          } else {
            ++num_failed;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    const PostgresJobStore::WriteStats stats = (*store)->GetWriteStats();
    std::printf(
        "group_commit=%-5s threads=%d: %8.0f creates/s (%lld ok, %lld failed), %.1f writes per "
        "transaction\n",
        group_commit ? "true" : "false", num_threads,
        static_cast<double>(num_ok) / absl::ToDoubleSeconds(duration),
        static_cast<long long>(num_ok.load()), static_cast<long long>(num_failed.load()),
        stats.num_transactions ? static_cast<double>(stats.num_writes) / stats.num_transactions
                               : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace tally::store

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tally::store::Run();
}
