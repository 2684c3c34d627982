// Fuzzes sched::Scheduler with what the Workers stream and the Jobs API can
// send it, in any order: an in-memory store, a fake clock, a channel that
// records what the scheduler sends.
//
// The input is a sequence of operations (one byte picks each, the bytes after
// it are its arguments): submit a small valid spec, Hello from worker k, a
// WorkerMessage from worker k (built from fields that refer to the jobs and
// attempts the scheduler assigned, or parsed from raw bytes), Tick, advance
// the clock, disconnect worker k (current or stale stream), cancel a job,
// restart the scheduler on the same store (Recover).
//
// Every input starts from a job running on one worker (Prologue). After
// every operation, for every job in the store:
// - its events are numbered 1..last_event_sequence with no gap, each naming
//   the job;
// - it has at most one RUNNING attempt, and none once it is terminal;
// - its costs are finite and >= 0, cost_usd never decreases, and the live
//   view (ActiveJobView) never shows less than the store;
// - once terminal, its state never changes;
// and no call returns INTERNAL or UNKNOWN (e.g. the store refused a commit).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler.h"
#include "server/store/job_store.h"
#include "server/store/memory_job_store.h"

namespace {

using tally::v1::ControllerMessage;
using tally::v1::WorkerMessage;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "scheduler_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

constexpr int kNumWorkers = 4;

class RecordingChannel : public tally::sched::WorkerChannel {
 public:
  void Send(const std::string& worker_id, const ControllerMessage& m) override {
    if (m.has_assignment()) assignments[worker_id].push_back(m.assignment());
  }
  std::map<std::string, std::vector<tally::v1::Assignment>> assignments;
};

std::string WorkerId(int k) { return absl::StrCat("w", k); }

// Mostly ordinary values; sometimes what a broken worker might send.
double PickDouble(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 4: return in.ConsumeFloatingPoint<double>();
    case 5: return std::numeric_limits<double>::quiet_NaN();
    case 6: return in.ConsumeBool() ? std::numeric_limits<double>::infinity()
                                    : -std::numeric_limits<double>::infinity();
    case 7: return -in.ConsumeFloatingPointInRange<double>(0, 10);
    default: return in.ConsumeFloatingPointInRange<double>(0, 10);
  }
}

int64_t PickInt(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 1000)
                          : in.ConsumeIntegral<int64_t>();
}

tally::v1::JobSpec PickSpec(FuzzedDataProvider& in) {
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(1);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_model()->set_num_heads(2);
  spec.mutable_data()->set_train_path("/data/x");
  spec.mutable_data()->set_seq_len(64);
  spec.mutable_training()->set_max_steps(in.ConsumeIntegralInRange<int>(1, 100));
  spec.mutable_training()->set_eval_interval_steps(in.ConsumeIntegralInRange<int>(0, 10));
  spec.mutable_training()->set_checkpoint_interval_steps(in.ConsumeIntegralInRange<int>(0, 10));
  spec.set_priority(in.ConsumeIntegralInRange<int>(-2, 2));
  spec.mutable_resources()->set_gpu_type(in.ConsumeBool() ? "cpu" : "h200");
  spec.mutable_resources()->set_gpu_count(
      in.ConsumeIntegralInRange<int>(0, 3) == 0 ? in.ConsumeIntegralInRange<int>(2, 3) : 1);
  spec.set_max_attempts(in.ConsumeIntegralInRange<int>(1, 3));
  if (in.ConsumeBool()) {
    spec.mutable_budget()->set_max_dollars(in.ConsumeFloatingPointInRange<double>(0.001, 5));
  }
  if (in.ConsumeBool()) {
    auto* es = spec.mutable_early_stopping();
    es->set_patience(in.ConsumeIntegralInRange<int>(1, 3));
    es->set_min_evals(in.ConsumeIntegralInRange<int>(0, 2));
    if (in.ConsumeBool()) es->set_divergence_factor(2);
    if (in.ConsumeBool()) {
      es->set_baseline_evals(in.ConsumeIntegralInRange<int>(1, 2));
      es->set_baseline_min_rel_gain(0.01);
    }
  }
  if (in.ConsumeBool()) {
    spec.mutable_model()->mutable_moe()->set_num_experts(2);
    spec.mutable_model()->mutable_moe()->set_top_k(1);
  }
  if (in.ConsumeBool()) {
    static const char* const kCapacities[] = {"any", "spot", "on_demand"};
    spec.mutable_resources()->set_capacity(kCapacities[in.ConsumeIntegralInRange<int>(0, 2)]);
    spec.set_max_preemptions(in.ConsumeIntegralInRange<int>(0, 2));
  }
  // A quantized evaluation, sometimes the metric the rules judge (a
  // worker's report then needs quantized_val_loss, refused without).
  if (in.ConsumeBool()) {
    spec.mutable_model()->set_d_model(32);
    spec.mutable_training()->set_eval_quantized(in.ConsumeBool() ? "q4_0" : "q8_0");
    if (in.ConsumeBool()) spec.mutable_early_stopping()->set_metric("quantized_val_loss");
    if (in.ConsumeBool()) {
      spec.mutable_early_stopping()->set_target_val_loss(
          in.ConsumeFloatingPointInRange<double>(0.5, 5));
    }
  }
  return spec;
}

tally::v1::Hello PickHello(FuzzedDataProvider& in, int k) {
  tally::v1::Hello h;
  h.set_worker_id(WorkerId(k));
  h.set_device("cpu");
  h.set_gpu_type(in.ConsumeBool() ? "cpu" : "h200");
  h.set_slots(in.ConsumeIntegralInRange<int>(0, 7) == 0 ? 0 : in.ConsumeIntegralInRange<int>(1, 3));
  if (in.ConsumeBool()) {
    h.set_rendezvous_host("127.0.0.1");
    h.set_rendezvous_port(in.ConsumeIntegralInRange<int>(1, 65535));
  }
  const int running = in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < running; ++i) {
    auto* r = h.add_running();
    r->set_job(absl::StrCat("jobs/", in.ConsumeIntegralInRange<int>(0, 5)));
    r->set_attempt(in.ConsumeIntegralInRange<int>(0, 4));
  }
  if (in.ConsumeBool()) h.set_capacity(in.ConsumeBool() ? "spot" : "on_demand");
  return h;
}

// A message about an attempt: one the scheduler assigned to this worker
// (most of the time), or made up.
WorkerMessage PickMessage(FuzzedDataProvider& in, const std::vector<tally::v1::Assignment>& sent) {
  std::string job = "jobs/1";
  int32_t attempt = 1;
  int32_t rank = 0;
  if (!sent.empty() && in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    const auto& a = sent[in.ConsumeIntegralInRange<size_t>(0, sent.size() - 1)];
    job = a.job();
    attempt = a.attempt();
    rank = a.rank();
  } else {
    job = in.ConsumeBool() ? absl::StrCat("jobs/", in.ConsumeIntegralInRange<int>(-1, 5))
                           : in.ConsumeRandomLengthString(16);
    attempt = in.ConsumeIntegralInRange<int32_t>(-1, 4);
    rank = in.ConsumeIntegralInRange<int32_t>(-1, 3);
  }
  WorkerMessage m;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      m.mutable_heartbeat();
      break;
    case 1: {
      auto* p = m.mutable_progress();
      p->set_job(job);
      p->set_attempt(attempt);
      p->set_step(PickInt(in));
      p->set_tokens(PickInt(in));
      p->set_train_loss(PickDouble(in));
      p->set_lr(PickDouble(in));
      p->set_grad_norm(PickDouble(in));
      p->set_step_seconds(PickDouble(in));
      p->set_useful_tokens_per_second(PickDouble(in));
      p->set_padding_fraction(PickDouble(in));
      p->set_mfu(PickDouble(in));
      p->set_padding_tokens(PickInt(in));
      p->set_trained(in.ConsumeBool());
      if (in.ConsumeBool()) {
        p->set_fp8_overflows(PickInt(in));
        p->set_fp8_product_fraction(PickDouble(in));
        (*p->mutable_fp8_amax())["ffn.input"] = PickDouble(in);
      }
      if (in.ConsumeBool()) {
        auto* moe = p->add_moe();
        moe->set_layer(in.ConsumeIntegralInRange<int>(-1, 3));
        const int n = in.ConsumeIntegralInRange<int>(0, 3);
        for (int i = 0; i < n; ++i) moe->add_tokens_per_expert(PickInt(in));
        moe->set_max_over_mean_load(PickDouble(in));
        moe->set_router_entropy(PickDouble(in));
        moe->set_dropped_fraction(PickDouble(in));
      }
      break;
    }
    case 2: {
      auto* e = m.mutable_eval();
      e->set_job(job);
      e->set_attempt(attempt);
      e->set_step(PickInt(in));
      e->set_tokens(PickInt(in));
      e->set_val_loss(PickDouble(in));
      e->set_bits_per_byte(PickDouble(in));
      e->set_doc_val_loss(PickDouble(in));
      e->set_docs(PickInt(in));
      if (in.ConsumeBool()) e->set_quantized_val_loss(PickDouble(in));
      break;
    }
    case 3: {
      auto* c = m.mutable_checkpoint();
      c->set_job(job);
      c->set_attempt(attempt);
      c->set_step(PickInt(in));
      c->set_tokens(PickInt(in));
      c->set_path(in.ConsumeBool() ? "/ckpt/step" : in.ConsumeRandomLengthString(24));
      c->set_sha256(in.ConsumeBool() ? std::string(64, 'a') : in.ConsumeRandomLengthString(70));
      break;
    }
    case 4: {
      auto* x = m.mutable_exit();
      x->set_job(job);
      x->set_attempt(attempt);
      x->set_outcome(static_cast<tally::v1::AttemptOutcome>(in.ConsumeIntegralInRange<int>(0, 4)));
      x->set_reason(in.ConsumeRandomLengthString(16));
      x->set_retryable(in.ConsumeBool());
      x->set_step(PickInt(in));
      x->set_rank(in.ConsumeBool() ? rank : in.ConsumeIntegralInRange<int32_t>(-1, 3));
      if (x->outcome() == tally::v1::ATTEMPT_OUTCOME_PREEMPTED || in.ConsumeBool()) {
        static const char* const kCauses[] = {"", "sigterm", "notice_file", "priority", "bogus"};
        x->set_preemption_cause(kCauses[in.ConsumeIntegralInRange<int>(0, 4)]);
      }
      break;
    }
    case 5: {
      static const char* const kCauses[] = {"sigterm", "sigint", "notice_file", "priority", ""};
      m.mutable_notice()->set_cause(kCauses[in.ConsumeIntegralInRange<int>(0, 4)]);
      m.mutable_notice()->set_deadline_seconds(PickDouble(in));
      break;
    }
  }
  return m;
}

class Harness {
 public:
  Harness() {
    options_.prices.usd_per_gpu_hour = {{"cpu", 0.5}, {"h200", 4.0}};
    options_.stop_grace = absl::Seconds(30);
    options_.prices.spot_usd_per_gpu_hour = {{"h200", 1.5}};
    options_.min_runtime_before_preemption = absl::Minutes(1);
    Restart(/*recover=*/false);
  }

  void Restart(bool recover) {
    sched_.reset();
    registry_ = std::make_unique<tally::metrics::Registry>();
    sched_ = std::make_unique<tally::sched::Scheduler>(&store_, &channel_, &clock_,
                                                      registry_.get(), options_);
    generation_.clear();
    if (recover) Check("Recover", sched_->Recover());
  }

  // Every input starts from a job running on w0, with w1 (h200, able to
  // lead a gang) idle, so that short inputs reach the running-job paths.
  void Prologue() {
    tally::v1::JobSpec spec;
    spec.mutable_model()->set_num_layers(1);
    spec.mutable_model()->set_d_model(16);
    spec.mutable_model()->set_num_heads(2);
    spec.mutable_data()->set_train_path("/data/x");
    spec.mutable_data()->set_seq_len(64);
    spec.mutable_training()->set_max_steps(10);
    spec.mutable_resources()->set_gpu_type("cpu");
    spec.mutable_early_stopping()->set_patience(1);
    spec.mutable_budget()->set_max_dollars(1);
    auto job = sched_->Submit(spec, "");
    if (!job.ok()) Fail("the prologue's spec is refused: " + job.status().ToString());
    ++num_submitted_;
    for (int k : {0, 1}) {
      tally::v1::Hello h;
      h.set_worker_id(WorkerId(k));
      h.set_device("cpu");
      h.set_gpu_type(k == 0 ? "cpu" : "h200");
      h.set_slots(2);
      if (k == 1) {
        h.set_rendezvous_host("127.0.0.1");
        h.set_rendezvous_port(29500);
      }
      auto gen = sched_->OnHello(h);
      if (!gen.ok()) Fail("the prologue's Hello is refused: " + gen.status().ToString());
      generation_[h.worker_id()].push_back(*gen);
    }
    Check("Tick", sched_->Tick());
    if (channel_.assignments[WorkerId(0)].empty()) Fail("the prologue's job was not placed");
    CheckInvariants();
  }

  void Step(FuzzedDataProvider& in) {
    const int op = in.ConsumeIntegralInRange<int>(0, 9);
    int k = in.ConsumeIntegralInRange<int>(0, kNumWorkers - 1);
    if (op >= 2 && op <= 4 && channel_.assignments[WorkerId(k)].empty()) {
      // Messages mostly come from workers that were given something to run.
      for (int i = 1; i < kNumWorkers; ++i) {
        const int other = (k + i) % kNumWorkers;
        if (!channel_.assignments[WorkerId(other)].empty()) {
          k = other;
          break;
        }
      }
    }
    const std::string worker = WorkerId(k);
    switch (op) {
      case 0: {
        const std::string request_id =
            in.ConsumeBool() ? absl::StrCat("r", in.ConsumeIntegralInRange<int>(0, 2)) : "";
        auto job = sched_->Submit(PickSpec(in), request_id);
        Check("Submit", job.status());
        if (job.ok()) ++num_submitted_;
        break;
      }
      case 1: {
        auto gen = sched_->OnHello(PickHello(in, k));
        Check("OnHello", gen.status());
        if (gen.ok()) generation_[worker].push_back(*gen);
        break;
      }
      case 2:
      case 3:
      case 4:
        Check("OnMessage", sched_->OnMessage(worker, PickMessage(in, channel_.assignments[worker])));
        break;
      case 5: {
        WorkerMessage m;
        const std::string bytes = in.ConsumeRandomLengthString(256);
        if (m.ParseFromString(bytes)) Check("OnMessage(parsed)", sched_->OnMessage(worker, m));
        break;
      }
      case 6:
        Check("Tick", sched_->Tick());
        break;
      case 7:
        switch (in.ConsumeIntegralInRange<int>(0, 3)) {
          case 0: clock_.Advance(absl::Milliseconds(in.ConsumeIntegralInRange<int>(0, 2000))); break;
          case 1: clock_.Advance(absl::Seconds(in.ConsumeIntegralInRange<int>(0, 30))); break;
          case 2: clock_.Advance(absl::Minutes(in.ConsumeIntegralInRange<int>(0, 10))); break;
          case 3: clock_.Advance(absl::Hours(in.ConsumeIntegralInRange<int>(0, 48))); break;
        }
        break;
      case 8: {
        const std::vector<int64_t>& gens = generation_[worker];
        int64_t gen = in.ConsumeIntegralInRange<int64_t>(0, 3);
        if (!gens.empty() && in.ConsumeBool()) {
          gen = gens[in.ConsumeIntegralInRange<size_t>(0, gens.size() - 1)];
        }
        sched_->OnDisconnect(worker, gen);
        break;
      }
      case 9:
        if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
          Restart(/*recover=*/true);
        } else {
          // Cancels, and what an experiment asks of a job: a target in force, a stop.
          const int64_t id = in.ConsumeIntegralInRange<int64_t>(0, num_submitted_ + 1);
          switch (in.ConsumeIntegralInRange<int>(0, 2)) {
            case 0:
              Check("Cancel", sched_->Cancel(id, in.ConsumeRandomLengthString(16)).status());
              break;
            case 1:
              Check("SetTarget",
                    sched_->SetTarget(id, PickDouble(in), in.ConsumeRandomLengthString(16))
                        .status());
              break;
            case 2:
              Check("StopJob",
                    sched_->StopJob(id,
                                    in.ConsumeBool() ? tally::v1::JOB_STATE_EARLY_STOPPED
                                                     : tally::v1::JOB_STATE_BUDGET_EXHAUSTED,
                                    "experiment_halving", in.ConsumeRandomLengthString(16))
                        .status());
              break;
          }
        }
        break;
    }
    CheckInvariants();
  }

 private:
  static void Check(const char* call, const absl::Status& s) {
    if (s.code() == absl::StatusCode::kInternal || s.code() == absl::StatusCode::kUnknown) {
      Fail(absl::StrCat(call, " returned ", s.ToString()));
    }
  }

  static void CheckCost(const std::string& job, const char* what, double v) {
    if (!std::isfinite(v) || v < 0) Fail(absl::StrCat(job, ": ", what, " is ", v));
  }

  void CheckInvariants() {
    auto jobs = store_.ListJobs({.states = {}, .before_id = 0, .limit = 1 << 20});
    if (!jobs.ok()) Fail("ListJobs: " + jobs.status().ToString());
    for (const tally::store::JobRecord& rec : *jobs) {
      const tally::v1::Job& job = rec.job();
      const std::string& name = job.name();
      auto events = store_.ListEvents(rec.id(), 0, 1 << 20);
      if (!events.ok()) Fail("ListEvents: " + events.status().ToString());
      int64_t seq = 0;
      for (const tally::v1::JobEvent& e : *events) {
        if (e.sequence() != ++seq) {
          Fail(absl::StrCat(name, ": event ", e.sequence(), " where ", seq, " was due"));
        }
        if (e.job() != name) Fail(absl::StrCat(name, ": event ", seq, " names ", e.job()));
        if (!std::isfinite(e.cost_usd()) || e.cost_usd() < 0) {
          Fail(absl::StrCat(name, ": event ", seq, " has cost_usd ", e.cost_usd()));
        }
      }
      if (seq != job.last_event_sequence()) {
        Fail(absl::StrCat(name, ": last_event_sequence ", job.last_event_sequence(), " but ",
                          seq, " events"));
      }

      auto attempts = store_.ListAttempts(rec.id());
      if (!attempts.ok()) Fail("ListAttempts: " + attempts.status().ToString());
      int running = 0;
      for (const auto& a : *attempts) running += a.state() == tally::store::ATTEMPT_STATE_RUNNING;
      if (running > 1) Fail(absl::StrCat(name, ": ", running, " RUNNING attempts"));
      const bool terminal = tally::store::IsTerminal(job.state());
      if (terminal && running > 0) {
        Fail(absl::StrCat(name, " is ", tally::v1::JobState_Name(job.state()),
                          " with a RUNNING attempt"));
      }

      const tally::v1::CostStatus& cost = job.cost();
      CheckCost(name, "cost_usd", cost.cost_usd());
      CheckCost(name, "gpu_seconds", cost.gpu_seconds());
      CheckCost(name, "lost_usd", cost.lost_usd());
      CheckCost(name, "redone_usd", cost.redone_usd());
      CheckCost(name, "spot_gpu_seconds", cost.spot_gpu_seconds());
      if (job.preemption().count() < 0 ||
          job.preemption().count() != job.preemption().by_notice() + job.preemption().by_priority()) {
        Fail(absl::StrCat(name, ": preemptions ", job.preemption().ShortDebugString()));
      }
      CheckCost(name, "attempt_usd_since_checkpoint", cost.attempt_usd_since_checkpoint());
      CheckCost(name, "usd_per_gpu_hour", cost.usd_per_gpu_hour());
      double& last_cost = last_cost_[rec.id()];
      if (cost.cost_usd() < last_cost * (1 - 1e-12) - 1e-12) {
        Fail(absl::StrCat(name, ": cost_usd fell from ", last_cost, " to ", cost.cost_usd()));
      }
      last_cost = cost.cost_usd();

      auto [it, first] = terminal_.try_emplace(rec.id(), job.state());
      if (!first && it->second != job.state()) {
        Fail(absl::StrCat(name, " left terminal state ",
                          tally::v1::JobState_Name(it->second), " for ",
                          tally::v1::JobState_Name(job.state())));
      }
      if (!terminal && first) terminal_.erase(it);

      if (auto view = sched_->ActiveJobView(rec.id()); view.has_value()) {
        CheckCost(name, "cost_usd (active view)", view->cost().cost_usd());
        if (view->cost().cost_usd() < cost.cost_usd() * (1 - 1e-12) - 1e-12) {
          Fail(absl::StrCat(name, ": the active view's cost ", view->cost().cost_usd(),
                            " is below the stored ", cost.cost_usd()));
        }
      }
    }
  }

  tally::store::InMemoryJobStore store_;
  tally::FakeClock clock_;
  RecordingChannel channel_;
  tally::sched::SchedulerOptions options_;
  std::unique_ptr<tally::metrics::Registry> registry_;
  std::unique_ptr<tally::sched::Scheduler> sched_;
  std::map<std::string, std::vector<int64_t>> generation_;
  std::map<int64_t, double> last_cost_;
  std::map<int64_t, tally::v1::JobState> terminal_;
  int64_t num_submitted_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Harness h;
  h.Prologue();
  for (int ops = 0; ops < 200 && in.remaining_bytes() > 0; ++ops) h.Step(in);
  return 0;
}
