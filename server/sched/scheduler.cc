#include "server/sched/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/names.h"
#include "common/spec_validation.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "server/policy/placement.h"
#include "server/sched/proto_time.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

std::string StateName(JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

std::string ShortSeconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

}  // namespace

int Scheduler::WorkerState::Used() const {
  int n = 0;
  for (const auto& [key, ranks] : held) n += ranks;
  return n;
}

Scheduler::Scheduler(store::JobStore* store, WorkerChannel* channel,
                     const Clock* clock, metrics::Registry* registry,
                     SchedulerOptions options)
    : store_(store), channel_(channel), clock_(clock), options_(options) {
  queue_wait_ = &metrics::BuildHistogram()
                     .Name("tally_queue_wait_seconds")
                     .Help("Time jobs waited in QUEUED before an attempt started.")
                     .Register(*registry)
                     .Add({}, metrics::Histogram::ExponentialBuckets(0.01, 4, 10));
  queue_depth_ = &metrics::BuildGauge()
                      .Name("tally_queue_depth")
                      .Help("Jobs waiting in QUEUED.")
                      .Register(*registry)
                      .Add({});
  workers_gauge_ = &metrics::BuildGauge()
                        .Name("tally_workers")
                        .Help("Workers known to tallyd, by GPU type and whether "
                              "they are connected.")
                        .Register(*registry);
  slots_gauge_ = &metrics::BuildGauge()
                      .Name("tally_worker_slots")
                      .Help("Slots of connected workers, by GPU type and "
                            "whether they are free or used.")
                      .Register(*registry);
  attempts_ended_ = &metrics::BuildCounter()
                         .Name("tally_attempts_ended_total")
                         .Help("Attempts that ended, by outcome (succeeded, "
                               "failed, lost, stopped).")
                         .Register(*registry);
  transitions_ = &metrics::BuildCounter()
                      .Name("tally_job_transitions_total")
                      .Help("Job state transitions, by the state entered.")
                      .Register(*registry);
  auto* jobs = &metrics::BuildGauge()
                    .Name("tally_jobs")
                    .Help("Jobs by state, as stored.")
                    .Register(*registry);
  for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
    jobs->Add({{"state", StateName(static_cast<JobState>(s))}});
  }
  auto gauge = [&](const char* name, const char* help) {
    return &metrics::BuildGauge().Name(name).Help(help).Register(*registry);
  };
  job_gauges_.step = gauge("tally_job_step", "Latest step of a running job.");
  job_gauges_.train_loss = gauge("tally_job_train_loss", "Latest training loss of a running job.");
  job_gauges_.val_loss = gauge("tally_job_val_loss", "Latest validation loss of a running job.");
  job_gauges_.best_val_loss =
      gauge("tally_job_best_val_loss", "Best validation loss of a running job so far.");
  job_gauges_.tokens = gauge("tally_job_tokens",
                             "Tokens a running job has computed, by kind (useful or padding).");
  job_gauges_.useful_tokens_per_second = gauge(
      "tally_job_useful_tokens_per_second", "Document tokens per second of a running job.");
  job_gauges_.padding_fraction =
      gauge("tally_job_padding_fraction", "Fraction of a running job's tokens that are padding.");
  job_gauges_.cost = gauge("tally_job_cost_dollars", "Dollars a running job has cost so far.");
  job_gauges_.checkpoint_cost = gauge(
      "tally_job_checkpoint_cost_dollars",
      "Dollars between a running job's two latest checkpoints.");
  job_gauges_.patience_left = gauge(
      "tally_job_patience_left",
      "Evaluations a running job may go without improving before it is stopped.");
  job_gauges_.budget_fraction = gauge(
      "tally_job_budget_used_ratio", "Fraction of budget.max_dollars a running job has spent.");
  job_gauges_.fp8_overflows = gauge(
      "tally_job_fp8_overflows",
      "Values an FP8 job's current attempt clamped to the format's range.");
  job_gauges_.fp8_product_fraction = gauge(
      "tally_job_fp8_product_fraction",
      "Fraction of an FP8 job's matrix products computed in FP8.");
  job_gauges_.fp8_amax = gauge("tally_job_fp8_amax",
                               "Latest amax of an FP8 job's tensors, by group.");
  job_gauges_.moe_load = gauge(
      "tally_job_moe_max_over_mean_load",
      "MoE jobs: the busiest expert's tokens over the mean, per MoE layer (1 is balanced).");
  job_gauges_.moe_entropy =
      gauge("tally_job_moe_router_entropy", "MoE jobs: mean router entropy per layer, nats.");
  job_gauges_.moe_dropped = gauge(
      "tally_job_moe_dropped_fraction", "MoE jobs: token assignments over capacity, per layer.");
  job_gauges_.moe_expert_tokens = gauge(
      "tally_job_moe_expert_tokens", "MoE jobs: tokens each expert took at the latest step.");
  cost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_dollars_total")
                     .Help("Dollars accrued by running attempts, by GPU type.")
                     .Register(*registry);
  lost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_lost_dollars_total")
                     .Help("Dollars spent by failed or lost attempts after their last "
                           "checkpoint, by GPU type.")
                     .Register(*registry);
  early_stops_ = &metrics::BuildCounter()
                      .Name("tally_early_stops_total")
                      .Help("Jobs stopped early, by rule.")
                      .Register(*registry);
  for (const char* rule : {"patience", "divergence", "no_gain_over_baseline"}) {
    early_stops_->Add({{"rule", rule}});
  }
  // Jobs by state come from the store, the source of truth, at scrape time.
  registry->AddCollectCallback([store, jobs] {
    auto counts = store->CountJobsByState();
    if (!counts.ok()) return;
    std::map<JobState, int64_t> by_state(counts->begin(), counts->end());
    for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
      const auto state = static_cast<JobState>(s);
      jobs->Add({{"state", StateName(state)}}).Set(by_state[state]);
    }
  });
}

tally::v1::JobEvent Scheduler::NewEvent(const ActiveJob& job,
                                        const std::string& type,
                                        const std::string& reason,
                                        const std::string& detail) const {
  tally::v1::JobEvent e;
  e.set_job(job.rec.job().name());
  *e.mutable_time() = ToProto(clock_->Now());
  e.set_type(type);
  e.set_reason(reason);
  e.set_detail(detail);
  e.set_attempt(job.rec.job().attempt());
  e.set_step(job.rec.job().step());
  e.set_tokens(job.rec.job().tokens());
  e.set_cost_usd(job.rec.job().cost().cost_usd());
  e.set_patience_left(job.rec.job().spec().early_stopping().patience() > 0
                          ? (job.rec.job().early_stopping().evals() > 0
                                 ? job.rec.job().early_stopping().patience_left()
                                 : job.rec.job().spec().early_stopping().patience())
                          : -1);
  return e;
}

absl::Status Scheduler::Record(ActiveJob& job, JobState state,
                               const std::string& type,
                               const std::string& reason,
                               const std::string& detail, bool write_attempt) {
  store::Mutation m;
  m.job = job.rec;
  tally::v1::Job& j = *m.job->mutable_job();
  const bool transition = j.state() != state;
  j.set_state(state);
  if (transition) j.set_state_reason(reason);
  if (store::IsTerminal(state)) *j.mutable_end_time() = ToProto(clock_->Now());
  j.set_last_event_sequence(j.last_event_sequence() + 1);
  tally::v1::JobEvent e = NewEvent(job, type, reason, detail);
  e.set_sequence(j.last_event_sequence());
  e.set_state(state);
  m.events.push_back(e);
  if (write_attempt && job.attempt) m.attempts.push_back(*job.attempt);
  RETURN_IF_ERROR(store_->Commit(m));
  job.rec = *m.job;
  job.progress_dirty = false;
  if (transition) transitions_->Add({{"state", StateName(state)}}).Increment();
  return absl::OkStatus();
}

absl::Status Scheduler::AppendEvent(ActiveJob& job, tally::v1::JobEvent e,
                                    store::Mutation m) {
  m.job = job.rec;
  tally::v1::Job& j = *m.job->mutable_job();
  j.set_last_event_sequence(j.last_event_sequence() + 1);
  e.set_sequence(j.last_event_sequence());
  e.set_state(j.state());
  m.events.push_back(std::move(e));
  RETURN_IF_ERROR(store_->Commit(m));
  job.rec = *m.job;
  return absl::OkStatus();
}

absl::Status Scheduler::Recover() {
  ASSIGN_OR_RETURN(std::vector<store::JobRecord> jobs, store_->ListActiveJobs());
  const absl::Time now = clock_->Now();
  for (auto& rec : jobs) {
    ActiveJob job;
    job.rec = rec;
    job.queued_since = now;
    // A running attempt kept its GPUs while tallyd was down: cost resumes
    // from what was last stored.
    job.accrued_until = rec.job().cost().has_accrued_until()
                            ? FromProto(rec.job().cost().accrued_until())
                            : now;
    if (rec.job().state() == tally::v1::JOB_STATE_RUNNING) {
      ASSIGN_OR_RETURN(std::vector<store::AttemptRecord> attempts,
                       store_->ListAttempts(rec.id()));
      if (!attempts.empty() &&
          attempts.back().state() == store::ATTEMPT_STATE_RUNNING) {
        job.attempt = attempts.back();
        for (const std::string& w : job.attempt->worker_ids()) {
          WorkerState& ws = workers_[w];
          ws.rec.set_worker_id(w);
          ws.last_seen = now;  // it has heartbeat_timeout to come back
          ++ws.held[{rec.id(), job.attempt->attempt()}];
        }
      }
    }
    const int64_t id = rec.id();
    active_[id] = std::move(job);
    if (rec.job().state() == tally::v1::JOB_STATE_RUNNING &&
        !active_[id].attempt) {
      // RUNNING without a running attempt: the attempt's end was recorded
      // but not the job's; requeue it.
      RETURN_IF_ERROR(Record(active_[id], tally::v1::JOB_STATE_QUEUED,
                             "requeued", "recovered without a running attempt",
                             "", false));
    }
  }
  // Throughput measured by finished jobs, for estimates.
  store::JobQuery q;
  q.states = {tally::v1::JOB_STATE_SUCCEEDED, tally::v1::JOB_STATE_EARLY_STOPPED,
              tally::v1::JOB_STATE_BUDGET_EXHAUSTED};
  q.limit = 1000;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<store::JobRecord> page, store_->ListJobs(q));
    for (const auto& r : page) RecordThroughput(r.job());
    if (static_cast<int>(page.size()) < q.limit) break;
    q.before_id = page.back().id();
  }
  // Known workers keep their records (GPU type, slots) for the dashboards.
  ASSIGN_OR_RETURN(std::vector<store::WorkerRecord> stored, store_->ListWorkers());
  for (const auto& w : stored) {
    auto it = workers_.find(w.worker_id());
    if (it != workers_.end()) it->second.rec = w;
  }
  UpdateGauges();
  return absl::OkStatus();
}

absl::StatusOr<tally::v1::Job> Scheduler::Submit(tally::v1::JobSpec spec,
                                                 const std::string& request_id) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError(
        "request_id: must be at most 128 characters");
  }
  ApplySpecDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  const absl::Time now = clock_->Now();
  store::JobRecord rec;
  tally::v1::Job& job = *rec.mutable_job();
  *job.mutable_spec() = spec;
  job.set_state(tally::v1::JOB_STATE_QUEUED);
  job.set_state_reason("waiting for a worker");
  *job.mutable_create_time() = ToProto(now);
  job.set_request_id(request_id);
  if (auto estimate = EstimateCost(spec); estimate.ok()) {
    *job.mutable_cost()->mutable_estimate() = *estimate;
  }
  job.mutable_cost()->set_usd_per_gpu_hour(options_.prices.Price(spec.resources().gpu_type()));
  tally::v1::JobEvent first;
  first.set_type("submitted");
  first.set_state(tally::v1::JOB_STATE_QUEUED);
  *first.mutable_time() = ToProto(now);
  first.set_detail(absl::StrCat("needs ", spec.resources().gpu_count(), " x ",
                                spec.resources().gpu_type(), ", priority ",
                                spec.priority()));
  ASSIGN_OR_RETURN(store::CreateResult created,
                   store_->CreateJob(std::move(rec), std::move(first)));
  if (created.created) {
    ActiveJob& a = active_[created.job.id()];
    a.rec = created.job;
    a.queued_since = now;
    transitions_->Add({{"state", "QUEUED"}}).Increment();
  }
  return created.job.job();
}

absl::StatusOr<tally::v1::Job> Scheduler::Cancel(int64_t job_id,
                                                 const std::string& reason) {
  auto it = active_.find(job_id);
  if (it == active_.end()) {
    ASSIGN_OR_RETURN(store::JobRecord rec, store_->GetJob(job_id));
    return absl::FailedPreconditionError(
        absl::StrCat(rec.job().name(), " has already ended (",
                     StateName(rec.job().state()),
                     "); only QUEUED or RUNNING jobs can be cancelled"));
  }
  const std::string why =
      reason.empty() ? "cancelled by request" : absl::StrCat("cancelled: ", reason);
  RETURN_IF_ERROR(
      StopJob(it->second, tally::v1::JOB_STATE_CANCELLED, "cancelled", why, ""));
  ASSIGN_OR_RETURN(store::JobRecord rec, store_->GetJob(job_id));
  return rec.job();
}

void Scheduler::Stop(const std::string& worker_id, const std::string& job,
                     int32_t attempt, const std::string& reason) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.connected) return;
  tally::v1::ControllerMessage msg;
  msg.mutable_stop()->set_job(job);
  msg.mutable_stop()->set_attempt(attempt);
  msg.mutable_stop()->set_reason(reason);
  channel_->Send(worker_id, msg);
}

void Scheduler::StopOtherRanks(ActiveJob& job, const std::string& reason) {
  const int64_t id = job.rec.id();
  const int32_t n = job.attempt->attempt();
  std::set<std::string> workers(job.attempt->worker_ids().begin(),
                                job.attempt->worker_ids().end());
  for (const auto& w : workers) {
    auto it = workers_.find(w);
    if (it == workers_.end() || !it->second.held.count({id, n})) continue;
    if (it->second.connected) {
      // Its slots stay held until it reports the exit, so nothing new is
      // placed on a worker still busy ending this attempt (a gang rank
      // leaving a collective, a rendezvous port still bound).
      Stop(w, job.rec.job().name(), n, reason);
    } else {
      it->second.held.erase({id, n});  // nobody to confirm: free it now
    }
  }
}

bool Scheduler::CanLead(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  return it != workers_.end() && it->second.rec.rendezvous_port() > 0 &&
         !it->second.rec.rendezvous_host().empty();
}

std::string Scheduler::PickRendezvous(const std::string& leader) const {
  if (!CanLead(leader)) return "";  // the ranks fail with "rendezvous: is required"
  const auto& rec = workers_.at(leader).rec;
  std::set<std::string> taken;
  for (const auto& [id, job] : active_) {
    if (job.attempt && job.attempt->worker_ids_size() > 1 &&
        job.attempt->worker_ids(0) == leader) {
      taken.insert(job.attempt->rendezvous());
    }
  }
  for (int k = 0; k < std::max(1, rec.slots()); ++k) {
    std::string address = absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port() + k);
    if (!taken.count(address)) return address;
  }
  return absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port());
}

void Scheduler::Finish(int64_t job_id) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return;
  const tally::v1::Job& j = it->second.rec.job();
  RemoveJobMetrics(j);
  if (j.state() == tally::v1::JOB_STATE_SUCCEEDED ||
      j.state() == tally::v1::JOB_STATE_EARLY_STOPPED ||
      j.state() == tally::v1::JOB_STATE_BUDGET_EXHAUSTED) {
    RecordThroughput(j);
  }
  active_.erase(it);
}

absl::Status Scheduler::StartAttempt(ActiveJob& job,
                                     std::vector<std::string> rank_workers) {
  // Rank 0 hosts the rendezvous: a worker that advertises one leads.
  if (rank_workers.size() > 1 && !CanLead(rank_workers[0])) {
    auto leader = std::find_if(rank_workers.begin(), rank_workers.end(),
                               [&](const std::string& w) { return CanLead(w); });
    if (leader != rank_workers.end()) std::iter_swap(rank_workers.begin(), leader);
  }
  const int64_t id = job.rec.id();
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> checkpoints,
                   store_->ListCheckpoints(id));
  tally::v1::Job& j = *job.rec.mutable_job();
  j.set_attempt(j.attempt() + 1);
  j.clear_worker_ids();
  for (const auto& w : rank_workers) j.add_worker_ids(w);
  if (!j.has_start_time()) *j.mutable_start_time() = ToProto(now);

  store::AttemptRecord attempt;
  attempt.set_job_id(id);
  attempt.set_attempt(j.attempt());
  for (const auto& w : rank_workers) attempt.add_worker_ids(w);
  attempt.set_state(store::ATTEMPT_STATE_RUNNING);
  *attempt.mutable_start_time() = ToProto(now);
  if (!checkpoints.empty()) attempt.set_resume_step(checkpoints.back().step());
  if (rank_workers.size() > 1) attempt.set_rendezvous(PickRendezvous(rank_workers[0]));
  job.attempt = attempt;
  job.accrued_until = now;  // queued time costs nothing
  j.mutable_cost()->set_attempt_usd_since_checkpoint(0);

  std::string detail = absl::StrCat("attempt ", j.attempt(), " of ",
                                    j.spec().max_attempts(), " on ",
                                    absl::StrJoin(rank_workers, ","));
  if (!checkpoints.empty()) {
    absl::StrAppend(&detail, ", resuming from step ", checkpoints.back().step());
  }
  RETURN_IF_ERROR(Record(job, tally::v1::JOB_STATE_RUNNING, "started",
                         "placed on a worker", detail, true));
  queue_wait_->Observe(absl::ToDoubleSeconds(now - job.queued_since));

  // Record replaced job.rec: `j` must not outlive it.
  const tally::v1::Job& started = job.rec.job();
  for (size_t rank = 0; rank < rank_workers.size(); ++rank) {
    ++workers_[rank_workers[rank]].held[{id, started.attempt()}];
    tally::v1::ControllerMessage msg;
    auto* a = msg.mutable_assignment();
    a->set_job(started.name());
    a->set_attempt(started.attempt());
    *a->mutable_spec() = started.spec();
    if (!checkpoints.empty()) *a->mutable_resume_from() = checkpoints.back();
    a->set_rank(rank);
    a->set_world_size(rank_workers.size());
    if (rank_workers.size() > 1) {
      a->set_rendezvous(job.attempt->rendezvous());
      a->set_rendezvous_prefix(absl::StrCat(started.name(), "/attempt-", started.attempt()));
    }
    channel_->Send(rank_workers[rank], msg);
  }
  return absl::OkStatus();
}

absl::Status Scheduler::EndAttempt(ActiveJob& job,
                                   store::AttemptState attempt_state,
                                   const std::string& reason, bool may_retry) {
  const int64_t id = job.rec.id();
  const int32_t n = job.rec.job().attempt();
  const int32_t max = job.rec.job().spec().max_attempts();
  Accrue(job, clock_->Now());
  ChargeLostWork(job);
  if (job.attempt) {
    job.attempt->set_state(attempt_state);
    *job.attempt->mutable_end_time() = ToProto(clock_->Now());
    job.attempt->set_reason(reason);
    // The other ranks of a gang cannot go on without this one.
    StopOtherRanks(job, reason);
  }
  const char* outcome = attempt_state == store::ATTEMPT_STATE_LOST     ? "lost"
                        : attempt_state == store::ATTEMPT_STATE_FAILED ? "failed"
                                                                       : "stopped";
  attempts_ended_->Add({{"outcome", outcome}}).Increment();
  if (may_retry && n < max) {
    job.queued_since = clock_->Now();
    const std::string why = absl::StrCat("attempt ", n, " ", outcome, ": ", reason,
                                         "; requeued for attempt ", n + 1, " of ",
                                         max);
    RETURN_IF_ERROR(
        Record(job, tally::v1::JOB_STATE_QUEUED, "requeued", why, "", true));
    job.attempt.reset();
    return absl::OkStatus();
  }
  const std::string why =
      may_retry ? absl::StrCat("attempt ", n, " of ", max, " ", outcome, ": ",
                               reason, "; no attempts left (max_attempts ", max, ")")
                : absl::StrCat("attempt ", n, " ", outcome, ": ", reason);
  RETURN_IF_ERROR(Record(job, tally::v1::JOB_STATE_FAILED, "failed", why, "", true));
  Finish(id);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Scheduler::OnHello(const tally::v1::Hello& hello) {
  if (hello.worker_id().empty() || hello.worker_id().size() > 128) {
    return absl::InvalidArgumentError(
        "hello.worker_id: must be 1-128 characters");
  }
  if (hello.slots() < 1 || hello.slots() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.slots: must be between 1 and 1024, got ", hello.slots()));
  }
  if (hello.rendezvous_port() < 0 || hello.rendezvous_port() + hello.slots() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.rendezvous_port: must be 0 (cannot lead a multi-GPU attempt) or a port with room "
        "for one per slot below 65536, got ", hello.rendezvous_port()));
  }
  if (hello.gpu_type().empty()) {
    return absl::InvalidArgumentError("hello.gpu_type: is required (e.g. \"cpu\")");
  }
  const absl::Time now = clock_->Now();
  WorkerState& ws = workers_[hello.worker_id()];
  const auto first_seen = ws.rec.has_first_seen() ? ws.rec.first_seen() : ToProto(now);
  ws.rec.set_worker_id(hello.worker_id());
  ws.rec.set_device(hello.device());
  ws.rec.set_gpu_type(hello.gpu_type());
  ws.rec.set_slots(hello.slots());
  ws.rec.clear_capabilities();
  for (const auto& c : hello.capabilities()) ws.rec.add_capabilities(c);
  ws.rec.set_version(hello.version());
  ws.rec.set_rendezvous_host(hello.rendezvous_host());
  ws.rec.set_rendezvous_port(hello.rendezvous_port());
  *ws.rec.mutable_first_seen() = first_seen;
  *ws.rec.mutable_last_seen() = ToProto(now);
  ws.connected = true;
  // Dollar totals exist (at 0) for every GPU type that has a worker, so
  // dashboards and alerts see a series before the first dollar.
  cost_total_->Add({{"gpu_type", hello.gpu_type()}});
  lost_total_->Add({{"gpu_type", hello.gpu_type()}});
  ws.generation = next_generation_++;
  ws.last_seen = now;
  RETURN_IF_ERROR(store_->PutWorker(ws.rec));

  tally::v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(options_.heartbeat_interval));
  channel_->Send(hello.worker_id(), welcome);

  std::set<std::pair<int64_t, int32_t>> reported;
  for (const auto& r : hello.running()) {
    absl::StatusOr<int64_t> id = ParseJobName(r.job(), "hello.running.job");
    if (!id.ok()) continue;
    reported.insert({*id, r.attempt()});
  }
  // Attempts tallyd placed here that the worker no longer runs.
  std::vector<std::pair<int64_t, int32_t>> forgotten;
  for (const auto& [key, ranks] : ws.held) {
    if (!reported.count(key)) forgotten.push_back(key);
  }
  for (const auto& key : forgotten) {
    ws.held.erase(key);
    auto it = active_.find(key.first);
    if (it != active_.end() && it->second.attempt &&
        it->second.attempt->attempt() == key.second) {
      RETURN_IF_ERROR(EndAttempt(
          it->second, store::ATTEMPT_STATE_LOST,
          absl::StrCat("worker ", hello.worker_id(),
                       " reconnected without it (the worker restarted)"),
          true));
    }
  }
  for (const auto& r : hello.running()) {
    ActiveJob* job = CurrentAttempt(r.job(), r.attempt());
    const bool ours =
        job != nullptr &&
        std::count(job->attempt->worker_ids().begin(),
                   job->attempt->worker_ids().end(), hello.worker_id()) > 0;
    if (!ours) {
      Stop(hello.worker_id(), r.job(), r.attempt(),
           "stale attempt: tallyd no longer runs it here");
      continue;
    }
    const int ranks = std::count(job->attempt->worker_ids().begin(),
                                 job->attempt->worker_ids().end(),
                                 hello.worker_id());
    ws.held[{job->rec.id(), r.attempt()}] = ranks;
    RETURN_IF_ERROR(Record(*job, tally::v1::JOB_STATE_RUNNING, "adopted",
                           "worker reconnected",
                           absl::StrCat("attempt ", r.attempt(), " on ",
                                        hello.worker_id()),
                           false));
  }
  UpdateGauges();
  return ws.generation;
}

void Scheduler::OnDisconnect(const std::string& worker_id, int64_t generation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.generation != generation) return;
  it->second.connected = false;
  UpdateGauges();
}

Scheduler::ActiveJob* Scheduler::CurrentAttempt(const std::string& job,
                                                int32_t attempt) {
  absl::StatusOr<int64_t> id = ParseJobName(job, "job");
  if (!id.ok()) return nullptr;
  auto it = active_.find(*id);
  if (it == active_.end() || !it->second.attempt ||
      it->second.attempt->attempt() != attempt) {
    return nullptr;
  }
  return &it->second;
}

absl::Status Scheduler::OnMessage(const std::string& worker_id,
                                  const tally::v1::WorkerMessage& msg) {
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end() || !wit->second.connected) {
    return absl::FailedPreconditionError("send a Hello before other messages");
  }
  const absl::Time now = clock_->Now();
  wit->second.last_seen = now;

  auto current = [&](const std::string& job, int32_t attempt) -> ActiveJob* {
    ActiveJob* a = CurrentAttempt(job, attempt);
    if (a == nullptr) {
      wit->second.held.erase({ParseJobName(job).value_or(0), attempt});
      Stop(worker_id, job, attempt, "stale attempt: tallyd no longer runs it");
    }
    return a;
  };

  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kHeartbeat:
      return absl::OkStatus();
    case tally::v1::WorkerMessage::kProgress: {
      const auto& p = msg.progress();
      ActiveJob* job = current(p.job(), p.attempt());
      if (job == nullptr) return absl::OkStatus();
      tally::v1::Job& j = *job->rec.mutable_job();
      j.set_step(p.step());
      j.set_tokens(p.tokens());
      if (p.trained()) {
        j.set_train_loss(p.train_loss());
        j.set_padding_tokens(p.padding_tokens());
        const metrics::Labels l = {{"tally_job", j.name()}};
        job_gauges_.useful_tokens_per_second->Add(l).Set(p.useful_tokens_per_second());
        job_gauges_.padding_fraction->Add(l).Set(p.padding_fraction());
        if (p.fp8_product_fraction() > 0) {
          job_gauges_.fp8_overflows->Add(l).Set(static_cast<double>(p.fp8_overflows()));
          job_gauges_.fp8_product_fraction->Add(l).Set(p.fp8_product_fraction());
          for (const auto& [group, amax] : p.fp8_amax()) {
            SetJobSeries(j.name(), job_gauges_.fp8_amax, {{"tally_job", j.name()}, {"group", group}},
                         amax);
          }
        }
        if (p.moe_size() > 0) OnMoeProgress(*job, p);
      }
      Accrue(*job, now);
      UpdateJobMetrics(*job);
      ASSIGN_OR_RETURN(const bool over_budget, EnforceBudget(*job));
      if (over_budget) return absl::OkStatus();
      job->progress_dirty = true;
      if (now - job->last_progress_event < options_.progress_event_interval) {
        return absl::OkStatus();
      }
      job->last_progress_event = now;
      std::string detail =
          p.trained() ? absl::StrCat("lr ", p.lr(), ", grad_norm ", p.grad_norm(),
                                     ", ", p.useful_tokens_per_second(),
                                     " useful tokens/s, padding ",
                                     p.padding_fraction())
                      : "no training was done (placeholder worker)";
      tally::v1::JobEvent e = NewEvent(*job, "progress", "", detail);
      if (p.trained()) e.set_train_loss(p.train_loss());
      RETURN_IF_ERROR(AppendEvent(*job, std::move(e), {}));
      job->progress_dirty = false;
      return absl::OkStatus();
    }
    case tally::v1::WorkerMessage::kEval: {
      const auto& ev = msg.eval();
      ActiveJob* job = current(ev.job(), ev.attempt());
      if (job == nullptr) return absl::OkStatus();
      return OnEval(*job, ev);
    }
    case tally::v1::WorkerMessage::kCheckpoint: {
      const auto& c = msg.checkpoint();
      ActiveJob* job = current(c.job(), c.attempt());
      if (job == nullptr) return absl::OkStatus();
      job->rec.mutable_job()->set_step(c.step());
      job->rec.mutable_job()->set_tokens(c.tokens());
      store::Mutation m;
      tally::v1::Checkpoint ck;
      ck.set_job(c.job());
      ck.set_attempt(c.attempt());
      ck.set_step(c.step());
      ck.set_tokens(c.tokens());
      ck.set_path(c.path());
      ck.set_sha256(c.sha256());
      if (job->last_eval && job->last_eval->first == c.step()) {
        ck.set_val_loss(job->last_eval->second);
      }
      *ck.mutable_time() = ToProto(now);
      PriceCheckpoint(*job, &ck);
      m.checkpoints.push_back(ck);
      RETURN_IF_ERROR(AppendEvent(*job, NewEvent(*job, "checkpoint", "", c.path()),
                                  std::move(m)));
      job->last_checkpoint = std::move(ck);
      return absl::OkStatus();
    }
    case tally::v1::WorkerMessage::kExit:
      return HandleExit(worker_id, msg.exit());
    case tally::v1::WorkerMessage::kHello:
      return absl::FailedPreconditionError("Hello was already sent on this stream");
    case tally::v1::WorkerMessage::MSG_NOT_SET:
      return absl::InvalidArgumentError("worker message: no field set");
  }
  return absl::OkStatus();
}

absl::Status Scheduler::HandleExit(const std::string& worker_id,
                                   const tally::v1::AttemptExit& exit) {
  const int64_t id = ParseJobName(exit.job()).value_or(0);
  workers_[worker_id].held.erase({id, exit.attempt()});
  ActiveJob* job = CurrentAttempt(exit.job(), exit.attempt());
  if (job == nullptr) {  // e.g. the exit of a cancelled attempt
    UpdateGauges();
    return absl::OkStatus();
  }
  if (exit.step() > 0) job->rec.mutable_job()->set_step(exit.step());
  absl::Status s;
  switch (exit.outcome()) {
    case tally::v1::ATTEMPT_OUTCOME_SUCCEEDED: {
      if (job->attempt->worker_ids_size() > 1 && exit.rank() != 0) {
        // Another rank is done; rank 0 ends the job once its own reports
        // (the last evaluation and checkpoint) are in.
        UpdateGauges();
        return absl::OkStatus();
      }
      Accrue(*job, clock_->Now());
      job->attempt->set_state(store::ATTEMPT_STATE_SUCCEEDED);
      *job->attempt->mutable_end_time() = ToProto(clock_->Now());
      job->attempt->set_reason(exit.reason());
      // The other ranks end the same step; any still running is told to stop.
      StopOtherRanks(*job, "the attempt succeeded");
      attempts_ended_->Add({{"outcome", "succeeded"}}).Increment();
      s = Record(*job, tally::v1::JOB_STATE_SUCCEEDED, "succeeded",
                 exit.reason().empty() ? "completed" : exit.reason(), "", true);
      if (s.ok()) Finish(id);
      break;
    }
    case tally::v1::ATTEMPT_OUTCOME_FAILED:
      s = EndAttempt(*job, store::ATTEMPT_STATE_FAILED, exit.reason(),
                     exit.retryable());
      break;
    default:
      s = EndAttempt(*job, store::ATTEMPT_STATE_STOPPED,
                     absl::StrCat("worker ", worker_id, " stopped it: ",
                                  exit.reason()),
                     true);
  }
  UpdateGauges();
  return s;
}

absl::Status Scheduler::Tick() {
  const absl::Time now = clock_->Now();
  // 1. Workers silent past the timeout lose what they hold.
  for (auto it = workers_.begin(); it != workers_.end();) {
    WorkerState& ws = it->second;
    const absl::Duration silent = now - ws.last_seen;
    if (silent <= options_.heartbeat_timeout) {
      ++it;
      continue;
    }
    const std::string reason = absl::StrCat(
        "worker ", it->first, " silent for ", ShortSeconds(silent),
        " (heartbeat timeout ", ShortSeconds(options_.heartbeat_timeout), ")");
    auto held = ws.held;
    ws.held.clear();
    for (const auto& [key, ranks] : held) {
      auto jit = active_.find(key.first);
      if (jit != active_.end() && jit->second.attempt &&
          jit->second.attempt->attempt() == key.second) {
        RETURN_IF_ERROR(
            EndAttempt(jit->second, store::ATTEMPT_STATE_LOST, reason, true));
      }
    }
    it = ws.connected ? std::next(it) : workers_.erase(it);
  }

  // 2. Accrue cost; stop jobs over budget.
  std::vector<int64_t> running;
  for (const auto& [id, job] : active_) {
    if (job.rec.job().state() == tally::v1::JOB_STATE_RUNNING) running.push_back(id);
  }
  for (int64_t id : running) {
    ActiveJob& job = active_.at(id);
    Accrue(job, now);
    ASSIGN_OR_RETURN(const bool stopped, EnforceBudget(job));
    if (!stopped) UpdateJobMetrics(job);
  }

  // 3. Start what fits.
  std::vector<policy::QueuedJob> queued;
  for (const auto& [id, job] : active_) {
    if (job.rec.job().state() != tally::v1::JOB_STATE_QUEUED) continue;
    const auto& spec = job.rec.job().spec();
    queued.push_back({id, spec.priority(), FromProto(job.rec.job().create_time()),
                      spec.resources().gpu_type(), spec.resources().gpu_count()});
  }
  if (!queued.empty()) {
    std::vector<policy::WorkerSlots> free;
    for (const auto& [id, ws] : workers_) {
      if (!ws.connected || now - ws.last_seen > options_.heartbeat_timeout) continue;
      free.push_back({id, ws.rec.gpu_type(), ws.rec.slots() - ws.Used()});
    }
    for (const auto& p : policy::PlaceJobs(std::move(queued), std::move(free))) {
      RETURN_IF_ERROR(StartAttempt(active_.at(p.job_id), p.rank_workers));
    }
  }
  UpdateGauges();
  return absl::OkStatus();
}

void Scheduler::UpdateGauges() {
  queue_depth_->Set(QueueDepth());
  std::map<metrics::Labels, double> workers, slots;
  for (const auto& [id, ws] : workers_) {
    const std::string& type = ws.rec.gpu_type().empty() ? "unknown" : ws.rec.gpu_type();
    ++workers[{{"gpu_type", type}, {"state", ws.connected ? "connected" : "disconnected"}}];
    if (!ws.connected) continue;
    slots[{{"gpu_type", type}, {"state", "used"}}] += ws.Used();
    slots[{{"gpu_type", type}, {"state", "free"}}] +=
        std::max(0, ws.rec.slots() - ws.Used());
  }
  // A series seen once stays, at 0 when it empties, so alerts see the drop
  // rather than a vanished series.
  for (const auto& labels : seen_worker_labels_) {
    if (!workers.count(labels)) workers[labels] = 0;
  }
  for (const auto& labels : seen_slot_labels_) {
    if (!slots.count(labels)) slots[labels] = 0;
  }
  for (const auto& [labels, v] : workers) {
    workers_gauge_->Add(labels).Set(v);
    seen_worker_labels_.insert(labels);
  }
  for (const auto& [labels, v] : slots) {
    slots_gauge_->Add(labels).Set(v);
    seen_slot_labels_.insert(labels);
  }
}

int64_t Scheduler::QueueDepth() const {
  int64_t n = 0;
  for (const auto& [id, job] : active_) {
    n += job.rec.job().state() == tally::v1::JOB_STATE_QUEUED;
  }
  return n;
}

std::vector<WorkerView> Scheduler::Workers() const {
  std::vector<WorkerView> out;
  for (const auto& [id, ws] : workers_) {
    out.push_back({ws.rec, ws.connected, ws.last_seen, ws.Used()});
  }
  return out;
}

}  // namespace tally::sched
