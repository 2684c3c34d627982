#include "server/policy/preemption.h"

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(100000);
constexpr int kOld = 3600;  // seconds run: well past the 10m default

absl::Time Ago(int seconds) { return kNow - absl::Seconds(seconds); }

QueuedJob Waiting(int priority, int gpu_count, std::string capacity = "",
                  std::string gpu_type = "h200") {
  QueuedJob j;
  j.id = 100;
  j.priority = priority;
  j.create_time = Ago(10);
  j.gpu_type = std::move(gpu_type);
  j.gpu_count = gpu_count;
  j.capacity = std::move(capacity);
  return j;
}

struct Attempt {
  int64_t job_id;
  int priority;
  std::vector<std::string> workers;
  int ran_seconds = kOld;
  int checkpoint_seconds_ago = -1;  // -1: no checkpoint
  bool stopping = false;
  std::string gpu_type = "h200";
};

struct Case {
  std::string name;
  QueuedJob waiting;
  std::vector<Attempt> running;
  std::vector<WorkerSlots> free_slots;
  std::vector<std::pair<std::string, std::string>> worker_capacity;
  std::vector<int64_t> preempted_by;
  std::vector<int64_t> want_victims;
  std::string want_why;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<RunningAttempt> ToRunning(const std::vector<Attempt>& attempts) {
  std::vector<RunningAttempt> out;
  for (const Attempt& a : attempts) {
    RunningAttempt r;
    r.job_id = a.job_id;
    r.priority = a.priority;
    r.gpu_type = a.gpu_type;
    r.rank_workers = a.workers;
    r.started = Ago(a.ran_seconds);
    if (a.checkpoint_seconds_ago >= 0) r.last_checkpoint = Ago(a.checkpoint_seconds_ago);
    r.stopping = a.stopping;
    out.push_back(std::move(r));
  }
  return out;
}

class PreemptionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PreemptionTest, Chooses) {
  const Case& c = GetParam();
  const PreemptionDecision got =
      ChoosePreemptions(c.waiting, c.preempted_by, c.free_slots, ToRunning(c.running),
                        c.worker_capacity, kNow, PreemptionOptions{});
  EXPECT_EQ(got.victims, c.want_victims);
  EXPECT_EQ(got.why, c.want_why);
}

const std::vector<std::pair<std::string, std::string>> kSpotS = {{"s1", "spot"},
                                                                  {"s2", "spot"}};

INSTANTIATE_TEST_SUITE_P(
    Table, PreemptionTest,
    ::testing::Values(
        // Priorities.
        Case{"equal_or_higher_priority_is_never_preempted",
             Waiting(5, 1),
             {{1, 5, {"a"}}, {2, 6, {"b"}}},
             {}, {}, {},
             {},
             "no lower-priority attempt of h200 is running"},
        Case{"strictly_lower_priority_is_preempted",
             Waiting(5, 1),
             {{1, 5, {"a"}}, {2, 4, {"b"}}},
             {}, {}, {},
             {2},
             "preempting jobs/2 (priority 4, 1 slot) for 1 slot of h200"},
        // Minimum runtime, measured from the attempt's start.
        Case{"min_runtime_just_under",
             Waiting(5, 1),
             {{1, 0, {"a"}, 599}},
             {}, {}, {},
             {},
             "no lower-priority attempt of h200 has run 10m yet"},
        Case{"min_runtime_at_the_limit",
             Waiting(5, 1),
             {{1, 0, {"a"}, 600}},
             {}, {}, {},
             {1},
             "preempting jobs/1 (priority 0, 1 slot) for 1 slot of h200"},
        // Cycles.
        Case{"no_preempting_back_a_job_that_preempted_it",
             Waiting(5, 1),
             {{1, 0, {"a"}}},
             {}, {}, {1},
             {},
             "every lower-priority attempt of h200 preempted this job before"},
        Case{"cycle_excludes_even_the_lowest_priority",
             Waiting(5, 1),
             {{1, -9, {"a"}}, {2, 0, {"b"}}},
             {}, {}, {1},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 slot of h200"},
        // Gangs.
        Case{"two_rank_victim_frees_both_slots",
             Waiting(5, 2),
             {{1, 0, {"a", "a"}}},
             {}, {}, {},
             {1},
             "preempting jobs/1 (priority 0, 2 slots) for 2 slots of h200"},
        Case{"victims_freeing_three_do_not_serve_four_ranks",
             Waiting(5, 4),
             {{1, 0, {"a", "b"}}, {2, 0, {"c"}}},
             {}, {}, {},
             {},
             "preemptible lower-priority attempts of h200 hold 3 slots, the job needs 4"},
        Case{"victims_and_free_slots_together",
             Waiting(5, 4),
             {{1, 0, {"b", "b"}}, {2, 0, {"c"}}},
             {{"a", "h200", 1}}, {}, {},
             {1, 2},
             "preempting jobs/1 (priority 0, 2 slots) and jobs/2 (priority 0, 1 slot) for 4 "
             "slots of h200 (1 free already)"},
        // Choice among sufficient sets.
        Case{"fewest_victims_beat_lower_priority",
             Waiting(5, 2),
             {{1, -9, {"a"}}, {2, -8, {"b"}}, {3, 0, {"c", "c"}}},
             {}, {}, {},
             {3},
             "preempting jobs/3 (priority 0, 2 slots) for 2 slots of h200"},
        Case{"lowest_priority_among_equal_counts",
             Waiting(5, 1),
             {{1, 0, {"a"}}, {2, -3, {"b"}}, {3, -1, {"c"}}},
             {}, {}, {},
             {2},
             "preempting jobs/2 (priority -3, 1 slot) for 1 slot of h200"},
        // {1,2} has the lower sum (-6), {3,4} spares the priority-4 job.
        Case{"highest_victim_priority_compared_first",
             Waiting(5, 4),
             {{1, -10, {"a"}}, {2, 4, {"b", "b", "b"}}, {3, 0, {"c", "c"}},
              {4, 0, {"d", "d"}}},
             {}, {}, {},
             {3, 4},
             "preempting jobs/3 (priority 0, 2 slots) and jobs/4 (priority 0, 2 slots) for "
             "4 slots of h200"},
        Case{"most_recent_checkpoint_among_equal_priorities",
             Waiting(5, 1),
             {{1, 0, {"a"}, kOld, 100}, {2, 0, {"b"}, kOld, 50}, {3, 0, {"c"}}},
             {}, {}, {},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 slot of h200"},
        Case{"no_checkpoint_counts_as_oldest",
             Waiting(5, 1),
             {{1, 0, {"a"}, kOld, 5000}, {2, 0, {"b"}}},
             {}, {}, {},
             {1},
             "preempting jobs/1 (priority 0, 1 slot) for 1 slot of h200"},
        Case{"newest_job_last",
             Waiting(5, 1),
             {{1, 0, {"a"}}, {2, 0, {"b"}}},
             {}, {}, {},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 slot of h200"},
        // Capacity.
        Case{"spot_job_not_served_by_on_demand_slots",
             Waiting(5, 1, "spot"),
             {{1, 0, {"o1"}}},
             {}, {{"o1", "on_demand"}}, {},
             {},
             "no lower-priority attempt of h200 runs on spot workers"},
        Case{"spot_job_counts_only_spot_ranks",
             Waiting(5, 2, "spot"),
             {{1, 0, {"s1", "o1"}}, {2, -1, {"s2"}}, {3, -5, {"o1"}}},
             {{"o1", "h200", 5, "on_demand"}}, kSpotS, {},
             {1, 2},
             "preempting jobs/1 (priority 0, 1 of its 2 slots) and jobs/2 (priority -1, 1 "
             "slot) for 2 spot slots of h200"},
        Case{"on_demand_job_skips_spot_victims",
             Waiting(5, 1, "on_demand"),
             {{1, -5, {"s1"}}, {2, 0, {"unlisted"}}},
             {}, kSpotS, {},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 on-demand slot of h200"},
        Case{"any_job_counts_both_kinds",
             Waiting(5, 2, "any"),
             {{1, 0, {"s1", "o1"}}},
             {}, kSpotS, {},
             {1},
             "preempting jobs/1 (priority 0, 2 slots) for 2 slots of h200"},
        // GPU types.
        Case{"other_gpu_types_ignored",
             Waiting(5, 1),
             {{1, -9, {"x"}, kOld, -1, false, "a100"}, {2, 0, {"b"}}},
             {{"x", "a100", 4}}, {}, {},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 slot of h200"},
        // Free slots.
        Case{"free_slots_counted",
             Waiting(5, 3),
             {{1, -5, {"b", "b"}}, {2, 0, {"c"}}},
             {{"a", "h200", 2}}, {}, {},
             {1},
             "preempting jobs/1 (priority -5, 2 slots) for 3 slots of h200 (2 free already)"},
        Case{"free_slots_of_unaccepted_capacity_not_counted",
             Waiting(5, 2, "spot"),
             {{1, 0, {"s1"}}},
             {{"o1", "h200", 4, "on_demand"}, {"s2", "h200", 1, "spot"}}, kSpotS, {},
             {1},
             "preempting jobs/1 (priority 0, 1 slot) for 2 spot slots of h200 (1 free "
             "already)"},
        Case{"short_by_more_than_free",
             Waiting(5, 3),
             {{1, 0, {"b"}}},
             {{"a", "h200", 1}}, {}, {},
             {},
             "preemptible lower-priority attempts of h200 hold 1 slot, the job needs 2 more"},
        // Stopping attempts.
        Case{"stopping_attempt_skipped",
             Waiting(5, 1),
             {{1, -5, {"a"}, kOld, -1, true}, {2, 0, {"b"}}},
             {}, {}, {},
             {2},
             "preempting jobs/2 (priority 0, 1 slot) for 1 slot of h200"},
        Case{"all_stopping",
             Waiting(5, 1),
             {{1, -5, {"a"}, kOld, -1, true}},
             {}, {}, {},
             {},
             "every lower-priority attempt of h200 is already stopping"},
        // Already fits.
        Case{"already_fits",
             Waiting(5, 2),
             {{1, 0, {"b"}}},
             {{"a", "h200", 1}, {"c", "h200", 1}}, {}, {},
             {},
             "fits without preemption"},
        Case{"zero_gpu_count_needs_one_slot",
             Waiting(5, 0),
             {},
             {{"a", "h200", 1}}, {}, {},
             {},
             "fits without preemption"},
        // Reasons named together.
        Case{"mixed_reasons",
             Waiting(5, 1),
             {{1, 0, {"a"}, 10}, {2, 0, {"b"}, kOld, -1, true}, {3, 0, {"c"}}},
             {}, {}, {3},
             {},
             "no lower-priority attempt of h200 can be preempted (1 ran under 10m, 1 "
             "preempted this job before, 1 already stopping)"},
        Case{"short_with_reasons",
             Waiting(5, 3),
             {{1, 0, {"a"}}, {2, 0, {"b"}, 10}},
             {}, {}, {},
             {},
             "preemptible lower-priority attempts of h200 hold 1 slot, the job needs 3 (1 "
             "ran under 10m)"},
        // A job listed with two attempts is one victim with both slots.
        Case{"attempts_of_one_job_merge",
             Waiting(5, 2),
             {{1, 0, {"a"}}, {1, 0, {"b"}}, {2, -5, {"c"}}},
             {}, {}, {},
             {1},
             "preempting jobs/1 (priority 0, 2 slots) for 2 slots of h200"},
        Case{"merged_job_judged_by_newest_start",
             Waiting(5, 1),
             {{1, 0, {"a"}}, {1, 0, {"b"}, 10}},
             {}, {}, {},
             {},
             "no lower-priority attempt of h200 has run 10m yet"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(PreemptionChoiceTest, MinRuntimeIsAnOption) {
  RunningAttempt a;
  a.job_id = 1;
  a.gpu_type = "h200";
  a.rank_workers = {"a"};
  a.started = Ago(120);
  PreemptionOptions options;
  options.min_runtime = absl::Minutes(3);
  PreemptionDecision got =
      ChoosePreemptions(Waiting(5, 1), {}, {}, {a}, {}, kNow, options);
  EXPECT_THAT(got.victims, IsEmpty());
  EXPECT_EQ(got.why, "no lower-priority attempt of h200 has run 3m yet");
  options.min_runtime = absl::Minutes(2);
  got = ChoosePreemptions(Waiting(5, 1), {}, {}, {a}, {}, kNow, options);
  EXPECT_THAT(got.victims, ElementsAre(1));
}

TEST(PreemptionChoiceTest, OnlyTenantKeepsPreemptionInsideTheTenant) {
  RunningAttempt other;
  other.job_id = 1;
  other.priority = 0;
  other.gpu_type = "h200";
  other.tenant = "dev";
  other.rank_workers = {"a"};
  other.started = Ago(kOld);
  PreemptionOptions options;
  options.only_tenant = "research";
  PreemptionDecision got = ChoosePreemptions(Waiting(5, 1), {}, {}, {other}, {}, kNow, options);
  EXPECT_THAT(got.victims, IsEmpty());
  // The other tenant's attempt is not even mentioned.
  EXPECT_EQ(got.why, "no lower-priority attempt of h200 is running");
  RunningAttempt own = other;
  own.job_id = 2;
  own.tenant = "research";
  own.rank_workers = {"b"};
  got = ChoosePreemptions(Waiting(5, 1), {}, {}, {other, own}, {}, kNow, options);
  EXPECT_THAT(got.victims, ElementsAre(2));
  // Without only_tenant (an admin allowed cross-tenant preemption) another
  // tenant's attempt may go.
  options.only_tenant.reset();
  got = ChoosePreemptions(Waiting(5, 1), {}, {}, {other}, {}, kNow, options);
  EXPECT_THAT(got.victims, ElementsAre(1));
}

std::vector<RunningAttempt> OneSlotAttempts(int n, int first_id, int first_priority) {
  std::vector<RunningAttempt> out;
  for (int i = 0; i < n; ++i) {
    RunningAttempt a;
    a.job_id = first_id + i;
    a.priority = first_priority - i;
    a.gpu_type = "h200";
    a.rank_workers = {"w" + std::to_string(first_id + i)};
    a.started = Ago(kOld);
    out.push_back(std::move(a));
  }
  return out;
}

// 16 candidates: every set is tried, the lowest priorities win.
TEST(PreemptionChoiceTest, ExactUpToSixteenCandidates) {
  const auto running = OneSlotAttempts(16, 1, 0);  // priorities 0 .. -15
  const PreemptionDecision got =
      ChoosePreemptions(Waiting(5, 3), {}, {}, running, {}, kNow, PreemptionOptions{});
  EXPECT_THAT(got.victims, ElementsAre(14, 15, 16));
}

// Past 16 candidates the greedy still takes the fewest victims: one 3-rank
// job rather than three 1-rank jobs of lower priority.
TEST(PreemptionChoiceTest, GreedyPastSixteenKeepsFewestVictims) {
  auto running = OneSlotAttempts(30, 1, -1);
  RunningAttempt big;
  big.job_id = 500;
  big.priority = 0;
  big.gpu_type = "h200";
  big.rank_workers = {"x", "x", "y"};
  big.started = Ago(kOld);
  running.push_back(big);
  PreemptionDecision got =
      ChoosePreemptions(Waiting(5, 3), {}, {}, running, {}, kNow, PreemptionOptions{});
  EXPECT_THAT(got.victims, ElementsAre(500));

  // Among equal slot counts it takes the lowest priorities.
  running.pop_back();
  got = ChoosePreemptions(Waiting(5, 3), {}, {}, running, {}, kNow, PreemptionOptions{});
  EXPECT_THAT(got.victims, ElementsAre(28, 29, 30));
}

// The choice, written the slow and obvious way: every set, the fewest
// victims, then the sorted lists of the header compared as vectors.
std::vector<int64_t> ReferenceChoice(const std::vector<RunningAttempt>& running,
                                     int64_t need) {
  const int n = static_cast<int>(running.size());
  struct Key {
    int size;
    std::vector<int> priorities_desc;
    std::vector<absl::Time> checkpoints_asc;
    std::vector<int64_t> ids_asc;
  };
  auto better = [](const Key& a, const Key& b) {
    if (a.size != b.size) return a.size < b.size;
    if (a.priorities_desc != b.priorities_desc) return a.priorities_desc < b.priorities_desc;
    if (a.checkpoints_asc != b.checkpoints_asc) return a.checkpoints_asc > b.checkpoints_asc;
    return a.ids_asc > b.ids_asc;
  };
  bool found = false;
  Key best;
  std::vector<int64_t> best_ids;
  for (int mask = 1; mask < (1 << n); ++mask) {
    Key k{0, {}, {}, {}};
    int64_t freed = 0;
    for (int i = 0; i < n; ++i) {
      if ((mask >> i & 1) == 0) continue;
      ++k.size;
      freed += static_cast<int64_t>(running[i].rank_workers.size());
      k.priorities_desc.push_back(running[i].priority);
      k.checkpoints_asc.push_back(running[i].last_checkpoint);
      k.ids_asc.push_back(running[i].job_id);
    }
    if (freed < need) continue;
    std::sort(k.priorities_desc.begin(), k.priorities_desc.end(), std::greater<>());
    std::sort(k.checkpoints_asc.begin(), k.checkpoints_asc.end());
    std::sort(k.ids_asc.begin(), k.ids_asc.end());
    if (!found || better(k, best)) {
      found = true;
      best_ids = k.ids_asc;
      best = std::move(k);
    }
  }
  return best_ids;
}

// Few distinct priorities, checkpoints and sizes, so that ties are common and
// every level of the order decides some cases.
TEST(PreemptionChoiceTest, ExactSearchMatchesReference) {
  std::mt19937 rng(20240611);
  for (int round = 0; round < 500; ++round) {
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<RunningAttempt> running;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      RunningAttempt a;
      a.job_id = 1 + static_cast<int64_t>(rng() % 1000) * 16 + i;  // unique
      a.priority = -static_cast<int>(rng() % 3);
      a.gpu_type = "h200";
      a.rank_workers.assign(1 + rng() % 3, "w" + std::to_string(i));
      a.started = Ago(kOld);
      const int ckpt = static_cast<int>(rng() % 4);
      if (ckpt > 0) a.last_checkpoint = Ago(100 * ckpt);
      total += static_cast<int64_t>(a.rank_workers.size());
      running.push_back(std::move(a));
    }
    const int need = 1 + static_cast<int>(rng() % total);
    const PreemptionDecision got =
        ChoosePreemptions(Waiting(5, need), {}, {}, running, {}, kNow, PreemptionOptions{});
    ASSERT_EQ(got.victims, ReferenceChoice(running, need))
        << "round " << round << ": " << got.why;
  }
}

}  // namespace
}  // namespace tally::policy
