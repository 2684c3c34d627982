// Scheduler: workers joining (Hello: their record, the attempts they still
// run adopted, forgotten ones lost, stale ones stopped) and leaving.
#include "server/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/names.h"
#include "common/proto_time.h"
#include "common/spec_validation.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "server/policy/forecast.h"
#include "server/policy/placement.h"
#include "server/policy/preemption.h"
#include "server/policy/step_times.h"
#include "server/policy/stop_rules.h"
#include "server/policy/target.h"
#include "server/sched/eval_decision.h"
#include "server/sched/report_checks.h"

namespace tally::sched {

absl::Status Scheduler::ValidateHello(const tally::v1::Hello& hello) {
  if (hello.worker_id().empty() || hello.worker_id().size() > 128) {
    return absl::InvalidArgumentError("hello.worker_id: must be 1-128 characters");
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
  // It becomes a label of every fleet series: bounded like one.
  RETURN_IF_ERROR(CheckLabelValue("hello.gpu_type", hello.gpu_type()));
  if (hello.device().size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.device: at most 64 bytes, got ", hello.device().size()));
  }
  if (hello.version().size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.version: at most 128 bytes, got ", hello.version().size()));
  }
  if (hello.rendezvous_host().size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.rendezvous_host: at most 255 bytes, got ", hello.rendezvous_host().size()));
  }
  if (hello.capabilities_size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.capabilities: at most 64, got ", hello.capabilities_size()));
  }
  for (const std::string& c : hello.capabilities()) {
    if (c.size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("hello.capabilities: each at most 64 bytes, got ", c.size()));
    }
  }
  if (hello.running_size() > hello.slots()) {
    return absl::InvalidArgumentError(absl::StrCat("hello.running: at most hello.slots (",
                                                   hello.slots(), ") attempts, got ",
                                                   hello.running_size()));
  }
  if (!hello.capacity().empty() && hello.capacity() != "spot" &&
      hello.capacity() != "on_demand") {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.capacity: must be \"spot\" or \"on_demand\" (tally-worker --capacity), got ",
        QuoteForMessage(hello.capacity(), 64)));
  }
  return absl::OkStatus();
}

bool Scheduler::WorkerLive(const std::string& worker_id) const {
  return workers_.Live(worker_id, clock_->Now());
}

namespace {

absl::Status CheckGpuTypeKnown(const std::string& gpu_type, const ledger::PriceTable& prices,
                               const std::set<std::string>& seen) {
  const std::vector<std::string> known = prices.KnownGpuTypes();
  if (!known.empty()) {
    if (std::binary_search(known.begin(), known.end(), gpu_type)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.gpu_type: ", QuoteForMessage(gpu_type), " is not a GPU type tallyd knows (",
        absl::StrJoin(known, ", "),
        "); set tally-worker --gpu_type to one of them, or add it to worker_gpu_types (or "
        "price it in usd_per_gpu_hour) in tallyd's --config"));
  }
  // Nothing configured: any type, but no more than a few distinct ones
  // since tallyd started (each keeps its series), so that one credential
  // cannot grow the fleet's series without bound.
  if (seen.count(gpu_type) || static_cast<int>(seen.size()) < Scheduler::kMaxUnlistedGpuTypes) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "hello.gpu_type: ", QuoteForMessage(gpu_type), " would be GPU type number ",
      seen.size() + 1, " and tallyd's --config names none (at most ", Scheduler::kMaxUnlistedGpuTypes,
      " then); list the types workers may announce in worker_gpu_types (or price them in "
      "usd_per_gpu_hour)"));
}

}  // namespace

absl::StatusOr<int64_t> Scheduler::OnHello(const tally::v1::Hello& hello) {
  RETURN_IF_ERROR(ValidateHello(hello));
  if (absl::Status s = CheckGpuTypeKnown(hello.gpu_type(), ledger_.prices(), gpu_types_seen_);
      !s.ok()) {
    metrics_.OnReportRefused("hello");
    return s;
  }
  const absl::Time now = clock_->Now();
  store::WorkerRecord rec;
  if (const WorkerState* known = workers_.Find(hello.worker_id())) rec = known->rec;
  const auto first_seen = rec.has_first_seen() ? rec.first_seen() : ToProto(now);
  rec.set_worker_id(hello.worker_id());
  rec.set_device(hello.device());
  rec.set_gpu_type(hello.gpu_type());
  rec.set_slots(hello.slots());
  rec.clear_capabilities();
  for (const auto& c : hello.capabilities()) rec.add_capabilities(c);
  rec.set_version(hello.version());
  rec.set_rendezvous_host(hello.rendezvous_host());
  rec.set_rendezvous_port(hello.rendezvous_port());
  rec.set_capacity(hello.capacity().empty() ? "on_demand" : hello.capacity());
  *rec.mutable_first_seen() = first_seen;
  *rec.mutable_last_seen() = ToProto(now);
  if (absl::Status s = store_->PutWorker(rec); !s.ok()) {
    // The worker was heard: its silence clock does not run while tallyd
    // cannot write (LoseSilentWorkers).
    NoteStoreFailure(s);
    return s;
  }
  NoteStoreSuccess();

  WorkerState& ws = workers_.Add(hello.worker_id());
  // A worker that went away after its notice (a spot VM reclaimed before its
  // exits were delivered) comes back as a new process under the same id.
  const std::string draining_before_hello = ws.draining;
  ws.rec = rec;
  ws.connected = true;
  ws.generation = workers_.NewGeneration();
  ws.last_seen = now;
  // Dollar totals exist (at 0) for every GPU type that has a worker, so
  // dashboards and alerts see a series before the first dollar.
  ws.counted_lost = false;
  ws.draining.clear();
  metrics_.AddGpuType(hello.gpu_type());
  gpu_types_seen_.insert(hello.gpu_type());

  tally::v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(options_.heartbeat_interval));
  // The worker's stream (api::WorkerStream) acknowledges what OnMessage takes.
  welcome.mutable_welcome()->set_acks(true);
  channel_->Send(hello.worker_id(), welcome);

  // An exit the worker reported on its last stream whose commit failed
  // ends its attempt now, not as "forgotten" below.
  absl::Status first_error = RetryExits(hello.worker_id());
  if (absl::Status s = LoseForgotten(hello, draining_before_hello); first_error.ok()) {
    first_error = s;
  }
  if (absl::Status s = AdoptRunning(hello, now); first_error.ok()) first_error = s;
  if (!first_error.ok()) {
    // Nothing is attached for a refused Hello: the worker must not look
    // connected (work would be placed on it); its next Hello reconciles again.
    workers_.Add(hello.worker_id()).connected = false;
    UpdateGauges();
    return first_error;
  }
  UpdateGauges();
  return ws.generation;
}

absl::Status Scheduler::LoseForgotten(const tally::v1::Hello& hello,
                                      const std::string& was_draining) {
  absl::Status first_error;
  std::set<AttemptKey> reported;
  for (const auto& r : hello.running()) {
    absl::StatusOr<int64_t> id = ParseJobName(r.job(), "hello.running.job");
    if (!id.ok()) continue;
    reported.insert({*id, r.attempt()});
  }
  // Attempts tallyd placed here that the worker no longer runs.
  std::vector<AttemptKey> forgotten;
  for (const auto& [key, ranks] : workers_.Find(hello.worker_id())->held) {
    if (!reported.count(key)) forgotten.push_back(key);
  }
  for (const auto& key : forgotten) {
    auto it = active_.find(key.first);
    if (it == active_.end() || !it->second.attempt || it->second.attempt->attempt() != key.second) {
      workers_.Release(hello.worker_id(), key);
      continue;
    }
    const std::string reason = absl::StrCat("worker ", hello.worker_id(),
                                            " reconnected without it (the worker restarted)");
    absl::StatusOr<Plan> p = WithCheckpoints(it->second, [&](const Checkpoints& cks) {
      return LoseAttempt(Ctx(), it->second, cks, was_draining, reason);
    });
    absl::Status s = p.status();
    if (p.ok()) {
      p->release.emplace_back(hello.worker_id(), key);
      s = Execute(key.first, *std::move(p));
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

absl::Status Scheduler::AdoptRunning(const tally::v1::Hello& hello, absl::Time now) {
  absl::Status first_error;
  // Each rank it runs of an attempt tallyd no longer runs there, by attempt.
  std::map<AttemptKey, int> stale_ranks;
  for (const auto& r : hello.running()) {
    ActiveJob* job = CurrentAttempt(r.job(), r.attempt());
    const int ranks =
        job == nullptr ? 0
                       : static_cast<int>(std::count(job->attempt->worker_ids().begin(),
                                                     job->attempt->worker_ids().end(),
                                                     hello.worker_id()));
    if (ranks == 0) {
      SendStop(hello.worker_id(), r.job(), r.attempt(),
               "stale attempt: tallyd no longer runs it here");
      if (absl::StatusOr<int64_t> id = ParseJobName(r.job()); id.ok()) {
        ++stale_ranks[{*id, r.attempt()}];
      }
      continue;
    }
    Plan p = NewPlan(Ctx(now), *job);
    AddEvent(p, "adopted", "worker reconnected",
             absl::StrCat("attempt ", r.attempt(), " on ", hello.worker_id()),
             tally::v1::JOB_STATE_RUNNING);
    p.hold.emplace_back(hello.worker_id(), AttemptKey{job->rec.id(), r.attempt()}, ranks);
    // A stop or a preemption decided before the worker went away: ask again.
    if (job->rec.job().has_pending_stop()) {
      p.sends.emplace_back(hello.worker_id(),
                           StopMessage(r.job(), r.attempt(),
                                       job->rec.job().pending_stop().reason(), true));
    } else if (!job->rec.job().preemption().pending_for().empty()) {
      p.sends.emplace_back(hello.worker_id(),
                           StopMessage(r.job(), r.attempt(),
                                       job->rec.job().preemption().pending_reason(), true, true));
    }
    if (absl::Status s = Execute(job->rec.id(), std::move(p)); !s.ok() && first_error.ok()) {
      first_error = s;
    }
  }
  // Until their exits arrive the worker is busy with them: nothing new is
  // placed on those slots (e.g. attempts tallyd gave up on while the worker
  // could not reach it). Set, not added: a hold kept while it was silent
  // is the same ranks.
  for (const auto& [key, ranks] : stale_ranks) workers_.Hold(hello.worker_id(), key, ranks);
  return first_error;
}

void Scheduler::OnDisconnect(const std::string& worker_id, int64_t generation) {
  WorkerState* found = workers_.Find(worker_id);
  if (found == nullptr || found->generation != generation) return;
  WorkerState& ws = *found;
  ws.connected = false;
  // Announced (a notice) and nothing left to hand back: a clean exit, not
  // a loss. Anything else is found silent past the heartbeat timeout.
  if (!ws.draining.empty() && ws.held.empty() && ws.unconfirmed_exits.empty() &&
      !ws.counted_lost) {
    ws.counted_lost = true;
    metrics_.OnWorkerExited(ws.rec.gpu_type(), ws.draining);
  }
  UpdateGauges();
}

}  // namespace tally::sched
