#include "server/policy/preemption.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally::policy {
namespace {

constexpr int kMaxExactCandidates = 16;
static_assert(kMaxExactCandidates <= 16, "SetWeights packs a dimension in 16 bits");

// A running job that may be preempted, its attempts of the GPU type merged.
struct Candidate {
  int64_t job_id = 0;
  int priority = 0;
  absl::Time last_checkpoint = absl::InfinitePast();
  int64_t usable = 0;  // slots on workers the waiting job accepts
  int64_t total = 0;   // all its ranks
};

// The preference between two single victims: lower priority, then the more
// recent checkpoint, then the higher id.
bool Preferred(const Candidate& a, const Candidate& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.last_checkpoint != b.last_checkpoint) return a.last_checkpoint > b.last_checkpoint;
  return a.job_id > b.job_id;
}

// Sets of one size are compared worst member first (see the header). With
// each member's value in a group, that order is the same as comparing the
// sets' member counts per group, most significant group first, fewer being
// better. So a set's key is the sum of its members' weights, where a member
// adds 1 to its group's bit field; a field as wide as its group's size needs
// holds any count, and with n candidates the fields of one dimension take at
// most n bits. `more_significant(a, b)`: a's group is compared before b's.
template <typename T, typename Compare>
std::vector<uint64_t> FieldWeights(const std::vector<T>& values, Compare more_significant) {
  std::vector<T> groups = values;
  std::sort(groups.begin(), groups.end(), more_significant);
  auto same = [&](const T& a, const T& b) {
    return !more_significant(a, b) && !more_significant(b, a);
  };
  groups.erase(std::unique(groups.begin(), groups.end(), same), groups.end());
  std::vector<int> offsets(groups.size());
  int offset = 0;
  for (int g = static_cast<int>(groups.size()) - 1; g >= 0; --g) {
    offsets[g] = offset;
    int size = 0;
    for (const T& v : values) size += same(v, groups[g]) ? 1 : 0;
    while (size > 0) {  // the bits to hold a count up to `size`
      ++offset;
      size >>= 1;
    }
  }
  std::vector<uint64_t> weights;
  for (const T& v : values) {
    const auto g =
        std::lower_bound(groups.begin(), groups.end(), v, more_significant) - groups.begin();
    weights.push_back(uint64_t{1} << offsets[g]);
  }
  return weights;
}

// Each candidate's weight: priority fields (higher priority more
// significant), then checkpoint fields (older more significant), then id
// fields (lower id more significant). The smaller sum is the better set.
std::vector<uint64_t> SetWeights(const std::vector<Candidate>& cands) {
  std::vector<int> priorities;
  std::vector<absl::Time> checkpoints;
  std::vector<int64_t> ids;
  for (const Candidate& c : cands) {
    priorities.push_back(c.priority);
    checkpoints.push_back(c.last_checkpoint);
    ids.push_back(c.job_id);
  }
  const auto by_priority = FieldWeights(priorities, std::greater<>());
  const auto by_checkpoint = FieldWeights(checkpoints, std::less<>());
  const auto by_id = FieldWeights(ids, std::less<>());
  std::vector<uint64_t> weights;
  for (size_t i = 0; i < cands.size(); ++i) {
    weights.push_back(by_priority[i] << 32 | by_checkpoint[i] << 16 | by_id[i]);
  }
  return weights;
}

// The fewest victims that free `short_by`: the largest first.
int MinVictims(const std::vector<Candidate>& cands, int64_t short_by) {
  std::vector<int64_t> usable;
  for (const Candidate& c : cands) usable.push_back(c.usable);
  std::sort(usable.begin(), usable.end(), std::greater<>());
  int64_t freed = 0;
  for (int i = 0; i < static_cast<int>(usable.size()); ++i) {
    freed += usable[i];
    if (freed >= short_by) return i + 1;
  }
  return static_cast<int>(usable.size()) + 1;
}

// Tries every set of the fewest victims (the sets of `size` members, in
// increasing mask order) and keeps the best by the order in the header.
std::vector<const Candidate*> ChooseExact(const std::vector<Candidate>& cands, int64_t short_by) {
  const int n = static_cast<int>(cands.size());
  const int size = MinVictims(cands, short_by);
  if (size > n) return {};
  const uint32_t end = uint32_t{1} << n;
  const std::vector<uint64_t> weights = SetWeights(cands);
  uint32_t best_mask = 0;
  uint64_t best_key = 0;
  for (uint32_t mask = (uint32_t{1} << size) - 1; mask < end;) {
    int64_t freed = 0;
    uint64_t key = 0;
    for (uint32_t bits = mask; bits != 0; bits &= bits - 1) {
      const int i = absl::countr_zero(bits);
      freed += cands[i].usable;
      key += weights[i];
    }
    if (freed >= short_by && (best_mask == 0 || key < best_key)) {
      best_mask = mask;
      best_key = key;
    }
    // The next larger mask with as many bits set (Gosper's hack).
    const uint32_t low = mask & (~mask + 1);
    const uint32_t ripple = mask + low;
    mask = ripple | (((ripple ^ mask) >> 2) / low);
  }
  std::vector<const Candidate*> chosen;
  for (int i = 0; i < n; ++i) {
    if (best_mask & (uint32_t{1} << i)) chosen.push_back(&cands[i]);
  }
  return chosen;
}

std::vector<const Candidate*> ChooseGreedy(const std::vector<Candidate>& cands, int64_t short_by) {
  std::vector<const Candidate*> order;
  for (const Candidate& c : cands) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
    if (a->usable != b->usable) return a->usable > b->usable;
    return Preferred(*a, *b);
  });
  // Taking the largest first, no victim taken can be dropped afterwards: the
  // sum before the last one was short, and every earlier one frees as much.
  std::vector<const Candidate*> chosen;
  int64_t freed = 0;
  for (const Candidate* c : order) {
    if (freed >= short_by) break;
    chosen.push_back(c);
    freed += c->usable;
  }
  return chosen;
}

std::string Slots(int64_t n, const std::string& kind) {
  return absl::StrCat(n, " ", kind, n == 1 ? "slot" : "slots");
}

std::string KindWord(const std::string& job_capacity) {
  if (job_capacity == "spot") return "spot ";
  if (job_capacity == "on_demand") return "on-demand ";
  return "";
}

// A job with several attempts listed is one candidate: it is stopped whole,
// so it is judged by its newest start and is out if any attempt stops.
struct RunningJob {
  int priority = 0;
  absl::Time started = absl::InfinitePast();
  absl::Time last_checkpoint = absl::InfinitePast();
  bool stopping = false;
  int64_t usable = 0;
  int64_t total = 0;
};

// The running attempts of `waiting`'s GPU type (and options.only_tenant),
// by job; `usable` counts the ranks on workers whose capacity it accepts.
std::map<int64_t, RunningJob> RunningJobs(
    const QueuedJob& waiting, const std::vector<RunningAttempt>& running,
    const std::vector<std::pair<std::string, std::string>>& worker_capacity,
    const PreemptionOptions& options) {
  std::map<std::string, std::string> capacity_of(worker_capacity.begin(), worker_capacity.end());
  auto accepts = [&](const std::string& worker) {
    auto it = capacity_of.find(worker);
    return CapacityMatches(waiting.capacity, it == capacity_of.end() ? "" : it->second);
  };
  std::map<int64_t, RunningJob> jobs;
  for (const RunningAttempt& a : running) {
    if (a.gpu_type != waiting.gpu_type) continue;
    if (options.only_tenant.has_value() && a.tenant != *options.only_tenant) continue;
    auto [it, inserted] = jobs.try_emplace(a.job_id);
    RunningJob& j = it->second;
    j.priority = inserted ? a.priority : std::max(j.priority, a.priority);
    j.started = std::max(j.started, a.started);
    j.last_checkpoint = std::max(j.last_checkpoint, a.last_checkpoint);
    j.stopping = j.stopping || a.stopping;
    for (const std::string& w : a.rank_workers) {
      ++j.total;
      if (accepts(w)) ++j.usable;
    }
  }
  return jobs;
}

// The lower-priority jobs: those that may be preempted, and how many of the
// others are out for each reason.
struct Candidates {
  int num_lower = 0, num_cycle = 0, num_stopping = 0, num_young = 0, num_elsewhere = 0;
  std::vector<Candidate> cands;
};

Candidates SortCandidates(const QueuedJob& waiting, const std::map<int64_t, RunningJob>& jobs,
                          const std::vector<int64_t>& preempted_by, absl::Time now,
                          const PreemptionOptions& options) {
  const std::set<int64_t> excluded(preempted_by.begin(), preempted_by.end());
  Candidates c;
  for (const auto& [id, j] : jobs) {
    if (j.priority >= waiting.priority) continue;
    ++c.num_lower;
    if (excluded.count(id) > 0) {
      ++c.num_cycle;
    } else if (j.stopping) {
      ++c.num_stopping;
    } else if (now - j.started < options.min_runtime) {
      ++c.num_young;
    } else if (j.usable == 0) {
      ++c.num_elsewhere;
    } else {
      c.cands.push_back({id, j.priority, j.last_checkpoint, j.usable, j.total});
    }
  }
  return c;
}

// Why no lower-priority job of `gpu` can be preempted (`c.cands` is empty).
std::string NoCandidateReason(const Candidates& c, const std::string& gpu,
                              const std::string& min_runtime, const std::string& workers_word,
                              const std::vector<std::string>& reasons) {
  const std::string subject = absl::StrCat("lower-priority attempt of ", gpu);
  if (c.num_lower == 0) return absl::StrCat("no ", subject, " is running");
  if (c.num_young == c.num_lower) {
    return absl::StrCat("no ", subject, " has run ", min_runtime, " yet");
  }
  if (c.num_cycle == c.num_lower) {
    return absl::StrCat("every ", subject, " preempted this job before");
  }
  if (c.num_stopping == c.num_lower) {
    return absl::StrCat("every ", subject, " is already stopping");
  }
  if (c.num_elsewhere == c.num_lower) {
    return absl::StrCat("no ", subject, " runs on ", workers_word);
  }
  return absl::StrCat("no ", subject, " can be preempted (", absl::StrJoin(reasons, ", "), ")");
}

// The decision to preempt `chosen` (not empty), with its explanation.
PreemptionDecision Preempt(std::vector<const Candidate*> chosen, int64_t need,
                           const std::string& kind, const std::string& gpu, int64_t free_now) {
  std::sort(chosen.begin(), chosen.end(),
            [](const Candidate* a, const Candidate* b) { return a->job_id < b->job_id; });
  PreemptionDecision out;
  std::vector<std::string> parts;
  for (const Candidate* c : chosen) {
    out.victims.push_back(c->job_id);
    parts.push_back(absl::StrCat("jobs/", c->job_id, " (priority ", c->priority, ", ",
                                 c->usable == c->total
                                     ? Slots(c->usable, "")
                                     : absl::StrCat(c->usable, " of its ", Slots(c->total, "")),
                                 ")"));
  }
  std::string victims_text = parts.back();
  if (parts.size() > 1) {
    parts.pop_back();
    victims_text = absl::StrCat(absl::StrJoin(parts, ", "), " and ", victims_text);
  }
  out.why = absl::StrCat("preempting ", victims_text, " for ", Slots(need, kind), " of ", gpu);
  if (free_now > 0) absl::StrAppend(&out.why, " (", free_now, " free already)");
  return out;
}

}  // namespace

PreemptionDecision ChoosePreemptions(
    const QueuedJob& waiting, const std::vector<int64_t>& preempted_by,
    const std::vector<WorkerSlots>& free_slots, const std::vector<RunningAttempt>& running,
    const std::vector<std::pair<std::string, std::string>>& worker_capacity, absl::Time now,
    const PreemptionOptions& options) {
  const int64_t need = std::max(1, waiting.gpu_count);
  const std::string& gpu = waiting.gpu_type;
  const std::string kind = KindWord(waiting.capacity);

  int64_t free_now = 0;
  for (const WorkerSlots& w : free_slots) {
    if (w.gpu_type == gpu && w.free_slots > 0 && CapacityMatches(waiting.capacity, w.capacity)) {
      free_now += w.free_slots;
    }
  }
  if (free_now >= need) return {{}, "fits without preemption"};
  const int64_t short_by = need - free_now;

  const std::map<int64_t, RunningJob> jobs =
      RunningJobs(waiting, running, worker_capacity, options);
  const Candidates found = SortCandidates(waiting, jobs, preempted_by, now, options);
  const std::vector<Candidate>& cands = found.cands;

  const std::string min_runtime = absl::FormatDuration(options.min_runtime);
  const std::string workers_word =
      kind.empty() ? "workers it accepts" : absl::StrCat(kind, "workers");
  std::vector<std::string> reasons;
  if (found.num_young > 0) {
    reasons.push_back(absl::StrCat(found.num_young, " ran under ", min_runtime));
  }
  if (found.num_cycle > 0) {
    reasons.push_back(absl::StrCat(found.num_cycle, " preempted this job before"));
  }
  if (found.num_stopping > 0) {
    reasons.push_back(absl::StrCat(found.num_stopping, " already stopping"));
  }
  if (found.num_elsewhere > 0) {
    reasons.push_back(absl::StrCat(found.num_elsewhere, " not on ", workers_word));
  }

  if (cands.empty()) {
    return {{}, NoCandidateReason(found, gpu, min_runtime, workers_word, reasons)};
  }

  int64_t available = 0;
  for (const Candidate& c : cands) available += c.usable;
  if (available < short_by) {
    std::string why = absl::StrCat("preemptible lower-priority attempts of ", gpu, " hold ",
                                   Slots(available, kind), ", the job needs ", short_by,
                                   free_now > 0 ? " more" : "");
    if (!reasons.empty()) absl::StrAppend(&why, " (", absl::StrJoin(reasons, ", "), ")");
    return {{}, why};
  }

  std::vector<const Candidate*> chosen = static_cast<int>(cands.size()) <= kMaxExactCandidates
                                             ? ChooseExact(cands, short_by)
                                             : ChooseGreedy(cands, short_by);
  if (chosen.empty()) return {{}, "no set of victims frees enough slots"};  // not reached
  return Preempt(std::move(chosen), need, kind, gpu, free_now);
}

}  // namespace tally::policy
