// Scheduler Tick() and /metrics rendering at fleet scale. Not a test: run
// `make bench` and read the numbers; nothing here asserts a speed.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "common/clock.h"
#include "server/metrics/registry.h"
#include "server/metrics/text_serializer.h"
#include "server/sched/scheduler.h"
#include "server/store/memory_job_store.h"

namespace tally {
namespace {

class NullChannel : public sched::WorkerChannel {
 public:
  void Send(const std::string&, const tally::v1::ControllerMessage&) override {}
};

tally::v1::JobSpec Spec(int i) {
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(2);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_num_heads(4);
  spec.mutable_data()->set_train_path("/data/x");
  spec.mutable_data()->set_seq_len(256);
  spec.mutable_training()->set_max_steps(1000);
  spec.set_priority(i % 7);
  spec.mutable_resources()->set_gpu_type(i % 2 ? "h200" : "cpu");
  return spec;
}

struct Fleet {
  FakeClock clock;
  store::InMemoryJobStore store;
  NullChannel channel;
  metrics::Registry registry;
  std::unique_ptr<sched::Scheduler> sched;

  Fleet(int num_jobs, int num_workers) {
    sched = std::make_unique<sched::Scheduler>(&store, &channel, &clock, &registry);
    for (int w = 0; w < num_workers; ++w) {
      tally::v1::Hello h;
      h.set_worker_id("w" + std::to_string(w));
      h.set_gpu_type(w % 2 ? "h200" : "cpu");
      h.set_slots(1);
      (void)sched->OnHello(h);
    }
    for (int i = 0; i < num_jobs; ++i) (void)sched->Submit(Spec(i), "");
  }
  void BeatAll(int num_workers) {
    tally::v1::WorkerMessage beat;
    beat.mutable_heartbeat();
    for (int w = 0; w < num_workers; ++w) {
      (void)sched->OnMessage("w" + std::to_string(w), beat);
    }
  }
};

// The first tick: 1,000 placements out of 10,000 queued jobs.
void BM_TickPlacingFleet(benchmark::State& state) {
  const int jobs = state.range(0), workers = state.range(1);
  for (auto _ : state) {
    state.PauseTiming();
    auto fleet = std::make_unique<Fleet>(jobs, workers);
    state.ResumeTiming();
    benchmark::DoNotOptimize(fleet->sched->Tick());
    state.PauseTiming();
    fleet.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_TickPlacingFleet)->Args({10000, 1000})->Unit(benchmark::kMillisecond)->Iterations(5);

// Every later tick: all slots busy, 9,000 still queued, heartbeats fresh.
void BM_TickSteadyState(benchmark::State& state) {
  const int jobs = state.range(0), workers = state.range(1);
  Fleet fleet(jobs, workers);
  (void)fleet.sched->Tick();
  for (auto _ : state) {
    fleet.clock.Advance(absl::Milliseconds(200));
    state.PauseTiming();
    fleet.BeatAll(workers);
    state.ResumeTiming();
    benchmark::DoNotOptimize(fleet.sched->Tick());
  }
}
BENCHMARK(BM_TickSteadyState)->Args({10000, 1000})->Unit(benchmark::kMillisecond);

// /metrics with 1,000 running jobs (1,000 workers busy).
void BM_MetricsRender(benchmark::State& state) {
  Fleet fleet(1000, 1000);
  (void)fleet.sched->Tick();
  // Per-job series (step, loss, tokens, dollars, ...): 10 gauges per running
  // job, the shape the job metrics take.
  auto& per_job = metrics::BuildGauge().Name("tally_job_value").Help("h").Register(fleet.registry);
  for (int j = 1; j <= 1000; ++j) {
    for (int k = 0; k < 10; ++k) {
      per_job.Add({{"job", "jobs/" + std::to_string(j)}, {"series", std::to_string(k)}}).Set(j);
    }
  }
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = metrics::SerializeText(fleet.registry.Collect());
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = bytes;
}
BENCHMARK(BM_MetricsRender)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tally

BENCHMARK_MAIN();
