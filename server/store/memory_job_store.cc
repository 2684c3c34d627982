#include "server/store/memory_job_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "google/protobuf/util/message_differencer.h"

namespace tally::store {

using google::protobuf::util::MessageDifferencer;

absl::StatusOr<CreateResult> InMemoryJobStore::CreateJob(
    JobRecord job, tally::v1::JobEvent first_event) {
  absl::MutexLock lock(&mu_);
  const std::string& request_id = job.job().request_id();
  const std::string key = RequestKey(job.job().tenant(), request_id);
  if (!request_id.empty()) {
    auto it = by_request_id_.find(key);
    if (it != by_request_id_.end()) {
      const JobRecord& existing = jobs_.at(it->second).job;
      if (!MessageDifferencer::Equals(existing.job().spec(), job.job().spec())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id \"", request_id, "\" was already used for ",
            existing.job().name(), " with a different spec"));
      }
      return CreateResult{existing, false};
    }
  }
  const int64_t id = next_id_++;
  job.set_id(id);
  job.mutable_job()->set_name(JobName(id));
  job.mutable_job()->set_last_event_sequence(1);
  first_event.set_job(job.job().name());
  first_event.set_sequence(1);
  Entry& entry = jobs_[id];
  entry.job = job;
  entry.events.push_back(first_event);
  if (!request_id.empty()) by_request_id_[key] = id;
  return CreateResult{job, true};
}

absl::Status InMemoryJobStore::Commit(const Mutation& m) {
  absl::MutexLock lock(&mu_);
  if (m.job) {
    auto it = jobs_.find(m.job->id());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job ", m.job->id(), " not found"));
    }
    it->second.job = *m.job;
  }
  for (const auto& e : m.events) {
    auto id = ParseJobName(e.job(), "event.job");
    if (!id.ok()) return id.status();
    auto& events = jobs_[*id].events;
    if (e.sequence() != static_cast<int64_t>(events.size()) + 1) {
      return absl::InternalError(absl::StrCat("event sequence gap for ", e.job(),
                                              ": got ", e.sequence()));
    }
    events.push_back(e);
  }
  for (const auto& a : m.attempts) jobs_[a.job_id()].attempts[a.attempt()] = a;
  for (const auto& c : m.checkpoints) {
    auto id = ParseJobName(c.job(), "checkpoint.job");
    if (!id.ok()) return id.status();
    jobs_[*id].checkpoints.push_back(c);
  }
  for (const SpendRecord& r : m.spend) spend_[{r.tenant, r.hour}] += r.usd;
  return absl::OkStatus();
}

absl::StatusOr<JobRecord> InMemoryJobStore::GetJob(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(JobName(id), " not found"));
  }
  return it->second.job;
}

absl::StatusOr<std::vector<SpendRecord>> InMemoryJobStore::ListSpend(int64_t since_hour) {
  absl::MutexLock lock(&mu_);
  std::vector<SpendRecord> out;
  for (const auto& [key, usd] : spend_) {
    if (key.second >= since_hour) out.push_back({key.first, key.second, usd});
  }
  return out;
}

absl::StatusOr<std::vector<JobRecord>> InMemoryJobStore::ListJobs(
    const JobQuery& q) {
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> out;
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
    if (static_cast<int>(out.size()) >= q.limit) break;
    if (q.before_id > 0 && it->first >= q.before_id) continue;
    const auto state = it->second.job.job().state();
    if (q.tenant && it->second.job.job().tenant() != *q.tenant) continue;
    if (!q.states.empty() &&
        std::find(q.states.begin(), q.states.end(), state) == q.states.end()) {
      continue;
    }
    out.push_back(it->second.job);
  }
  return out;
}

absl::StatusOr<std::vector<JobRecord>> InMemoryJobStore::ListActiveJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> out;
  for (const auto& [id, entry] : jobs_) {
    if (!IsTerminal(entry.job.job().state())) out.push_back(entry.job);
  }
  return out;
}

absl::StatusOr<std::vector<tally::v1::JobEvent>> InMemoryJobStore::ListEvents(
    int64_t job_id, int64_t after_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
  }
  std::vector<tally::v1::JobEvent> out;
  const auto& events = it->second.events;
  for (size_t i = std::max<int64_t>(after_sequence, 0);
       i < events.size() && static_cast<int>(out.size()) < limit; ++i) {
    out.push_back(events[i]);
  }
  return out;
}

absl::StatusOr<std::vector<AttemptRecord>> InMemoryJobStore::ListAttempts(
    int64_t job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<AttemptRecord> out;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return out;
  for (const auto& [n, a] : it->second.attempts) out.push_back(a);
  return out;
}

absl::StatusOr<std::vector<tally::v1::Checkpoint>>
InMemoryJobStore::ListCheckpoints(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::vector<tally::v1::Checkpoint>{};
  return it->second.checkpoints;
}

absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>>
InMemoryJobStore::CountJobsByState() {
  absl::MutexLock lock(&mu_);
  std::map<tally::v1::JobState, int64_t> counts;
  for (const auto& [id, entry] : jobs_) ++counts[entry.job.job().state()];
  return std::vector<std::pair<tally::v1::JobState, int64_t>>(counts.begin(),
                                                              counts.end());
}

absl::Status InMemoryJobStore::PutWorker(const WorkerRecord& worker) {
  absl::MutexLock lock(&mu_);
  workers_[worker.worker_id()] = worker;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerRecord>> InMemoryJobStore::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

absl::StatusOr<ExperimentCreateResult> InMemoryJobStore::CreateExperiment(
    ExperimentRecord rec, tally::v1::ExperimentEvent first_event) {
  absl::MutexLock lock(&mu_);
  const std::string& request_id = rec.experiment().request_id();
  const std::string key = RequestKey(rec.experiment().tenant(), request_id);
  if (!request_id.empty()) {
    auto it = experiment_by_request_id_.find(key);
    if (it != experiment_by_request_id_.end()) {
      const ExperimentRecord& existing = experiments_.at(it->second).record;
      if (!MessageDifferencer::Equals(existing.experiment().spec(), rec.experiment().spec())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id \"", request_id, "\" was already used for ",
            existing.experiment().name(), " with a different spec"));
      }
      return ExperimentCreateResult{existing, false};
    }
  }
  const int64_t id = next_experiment_id_++;
  rec.set_id(id);
  rec.mutable_experiment()->set_name(ExperimentName(id));
  rec.mutable_experiment()->set_last_event_sequence(1);
  first_event.set_experiment(rec.experiment().name());
  first_event.set_sequence(1);
  ExperimentEntry& entry = experiments_[id];
  entry.record = rec;
  entry.events.push_back(first_event);
  if (!request_id.empty()) experiment_by_request_id_[key] = id;
  return ExperimentCreateResult{rec, true};
}

absl::Status InMemoryJobStore::CommitExperiment(const ExperimentMutation& m) {
  absl::MutexLock lock(&mu_);
  auto it = experiments_.find(m.experiment.id());
  if (it == experiments_.end()) {
    return absl::NotFoundError(absl::StrCat(ExperimentName(m.experiment.id()), " not found"));
  }
  int64_t expected = static_cast<int64_t>(it->second.events.size()) + 1;
  for (const auto& e : m.events) {  // all or nothing
    if (e.sequence() != expected++) {
      return absl::InternalError(absl::StrCat("experiment event sequence gap for ",
                                              m.experiment.experiment().name(), ": got ",
                                              e.sequence()));
    }
  }
  for (const auto& e : m.events) it->second.events.push_back(e);
  it->second.record = m.experiment;
  return absl::OkStatus();
}

absl::StatusOr<ExperimentRecord> InMemoryJobStore::GetExperiment(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = experiments_.find(id);
  if (it == experiments_.end()) {
    return absl::NotFoundError(absl::StrCat(ExperimentName(id), " not found"));
  }
  return it->second.record;
}

absl::StatusOr<std::vector<ExperimentRecord>> InMemoryJobStore::ListExperiments(
    int64_t before_id, int limit, const std::optional<std::string>& tenant) {
  absl::MutexLock lock(&mu_);
  std::vector<ExperimentRecord> out;
  for (auto it = experiments_.rbegin(); it != experiments_.rend(); ++it) {
    if (static_cast<int>(out.size()) >= limit) break;
    if (before_id > 0 && it->first >= before_id) continue;
    if (tenant && it->second.record.experiment().tenant() != *tenant) continue;
    out.push_back(it->second.record);
  }
  return out;
}

absl::StatusOr<std::vector<ExperimentRecord>> InMemoryJobStore::ListActiveExperiments() {
  absl::MutexLock lock(&mu_);
  std::vector<ExperimentRecord> out;
  for (const auto& [id, e] : experiments_) {
    if (e.record.experiment().state() == tally::v1::EXPERIMENT_STATE_RUNNING) {
      out.push_back(e.record);
    }
  }
  return out;
}

absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> InMemoryJobStore::ListExperimentEvents(
    int64_t experiment_id, int64_t after_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  auto it = experiments_.find(experiment_id);
  if (it == experiments_.end()) {
    return absl::NotFoundError(absl::StrCat(ExperimentName(experiment_id), " not found"));
  }
  std::vector<tally::v1::ExperimentEvent> out;
  for (const auto& e : it->second.events) {
    if (e.sequence() > after_sequence && static_cast<int>(out.size()) < limit) out.push_back(e);
  }
  return out;
}

}  // namespace tally::store
