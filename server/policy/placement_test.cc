#include "server/policy/placement.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

absl::Time T(int s) { return absl::FromUnixSeconds(s); }

struct Case {
  std::string name;
  std::vector<QueuedJob> jobs;
  std::vector<WorkerSlots> workers;
  std::vector<Placement> want;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }


class PlacementTest : public ::testing::TestWithParam<Case> {};

TEST_P(PlacementTest, Places) {
  const auto got = PlaceJobs(GetParam().jobs, GetParam().workers);
  ASSERT_EQ(got.size(), GetParam().want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].job_id, GetParam().want[i].job_id) << i;
    EXPECT_EQ(got[i].rank_workers, GetParam().want[i].rank_workers) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, PlacementTest,
    ::testing::Values(
        Case{"priority_beats_age",
             {{1, 0, T(1), "cpu", 1}, {2, 5, T(2), "cpu", 1}},
             {{"w1", "cpu", 1}},
             {{2, {"w1"}}}},
        Case{"older_first_at_equal_priority",
             {{2, 0, T(2), "cpu", 1}, {1, 0, T(1), "cpu", 1}},
             {{"w1", "cpu", 1}},
             {{1, {"w1"}}}},
        Case{"gpu_type_must_match",
             {{1, 0, T(1), "h200", 1}},
             {{"w1", "cpu", 4}},
             {}},
        Case{"gang_all_or_nothing",
             {{1, 0, T(1), "h200", 4}},
             {{"a", "h200", 2}, {"b", "h200", 1}},
             {}},
        Case{"gang_spans_workers",
             {{1, 0, T(1), "h200", 3}},
             {{"a", "h200", 2}, {"b", "h200", 1}},
             {{1, {"a", "a", "b"}}}},
        Case{"gang_prefers_one_worker_best_fit",
             {{1, 0, T(1), "h200", 2}},
             {{"a", "h200", 8}, {"b", "h200", 2}, {"c", "h200", 1}},
             {{1, {"b", "b"}}}},
        Case{"backfill_behind_a_big_job",
             {{1, 9, T(1), "cpu", 4}, {2, 0, T(2), "cpu", 1}},
             {{"w1", "cpu", 2}},
             {{2, {"w1"}}}},
        Case{"slots_are_consumed",
             {{1, 0, T(1), "cpu", 1}, {2, 0, T(2), "cpu", 1}, {3, 0, T(3), "cpu", 1}},
             {{"w1", "cpu", 1}, {"w2", "cpu", 1}},
             {{1, {"w1"}}, {2, {"w2"}}}},
        Case{"full_workers_are_skipped",
             {{1, 0, T(1), "cpu", 1}},
             {{"w1", "cpu", 0}},
             {}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace tally::policy
