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
        // Reservations: a gang that fits the fleet but not its free slots.
        Case{"a_waiting_gang_keeps_the_free_slots_it_needs",
             {{1, 5, T(1), "cpu", 2}, {2, 0, T(2), "cpu", 1}, {3, 0, T(3), "cpu", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}},
             {}},
        Case{"also_from_younger_jobs_of_its_priority",
             {{1, 0, T(1), "cpu", 2}, {2, 0, T(2), "cpu", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}},
             {}},
        Case{"older_jobs_ahead_of_it_still_place",
             {{1, 0, T(2), "cpu", 2}, {2, 0, T(1), "cpu", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}},
             {{2, {"a"}}}},
        Case{"no_reservation_for_a_gang_no_fleet_of_its_type_holds",
             {{1, 5, T(1), "cpu", 4}, {2, 0, T(2), "cpu", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}},
             {{2, {"a"}}}},
        Case{"a_reservation_spans_workers",
             {{1, 5, T(1), "cpu", 4}, {2, 0, T(2), "cpu", 1}},
             {{"a", "cpu", 2, "", 2}, {"b", "cpu", 1, "", 1}, {"c", "cpu", 0, "", 2}},
             {}},
        Case{"a_reservation_leaves_the_rest",
             {{1, 5, T(1), "cpu", 3}, {2, 0, T(2), "cpu", 1}},
             {{"a", "cpu", 2, "", 4}, {"b", "cpu", 1, "", 1}},
             {{1, {"a", "a", "b"}}}},
        Case{"other_gpu_types_are_not_reserved",
             {{1, 5, T(1), "cpu", 2}, {2, 0, T(2), "h200", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}, {"h", "h200", 1, "", 1}},
             {{2, {"h"}}}},
        Case{"a_spot_gang_leaves_on_demand_slots",
             {{1, 5, T(1), "cpu", 2, "spot"}, {2, 0, T(2), "cpu", 1, "on_demand"}},
             {{"s1", "cpu", 1, "spot", 1}, {"s2", "cpu", 0, "spot", 1}, {"o", "cpu", 1, "", 1}},
             {{2, {"o"}}}},
        Case{"an_elastic_job_reserves_the_size_the_fleet_holds",
             {{1, 5, T(1), "cpu", 4, "", {2}}, {2, 0, T(2), "cpu", 1}},
             {{"a", "cpu", 1, "", 1}, {"b", "cpu", 0, "", 1}},
             {}},
        Case{"full_workers_are_skipped",
             {{1, 0, T(1), "cpu", 1}},
             {{"w1", "cpu", 0}},
             {}},
        // Smaller world sizes (a preempted job resuming).
        Case{"smaller_world_size_when_the_whole_gang_does_not_fit",
             {{1, 0, T(1), "h200", 4, "", {2, 1}}},
             {{"a", "h200", 1}, {"b", "h200", 2}},
             {{1, {"b", "b"}}}},
        Case{"whole_gang_first_when_it_fits",
             {{1, 0, T(1), "h200", 2, "", {1}}},
             {{"a", "h200", 1}, {"b", "h200", 1}},
             {{1, {"a", "b"}}}},
        Case{"no_smaller_sizes_means_all_or_nothing",
             {{1, 0, T(1), "h200", 2, "", {}}},
             {{"a", "h200", 1}},
             {}},
        Case{"smaller_sizes_keep_capacity",
             {{1, 0, T(1), "h200", 2, "spot", {1}}},
             {{"a", "h200", 4}, {"b", "h200", 1, "spot"}},
             {{1, {"b"}}}},
        // Capacity.
        Case{"spot_job_uses_only_spot_workers",
             {{1, 0, T(1), "h200", 1, "spot"}},
             {{"a", "h200", 4}, {"b", "h200", 1, "spot"}},
             {{1, {"b"}}}},
        Case{"spot_job_waits_without_spot_room",
             {{1, 0, T(1), "h200", 2, "spot"}},
             {{"a", "h200", 4, "on_demand"}, {"b", "h200", 1, "spot"}},
             {}},
        Case{"on_demand_job_skips_spot_workers",
             {{1, 0, T(1), "h200", 1, "on_demand"}},
             {{"a", "h200", 4, "spot"}, {"b", "h200", 1}},
             {{1, {"b"}}}},
        Case{"on_demand_job_waits_without_on_demand_room",
             {{1, 0, T(1), "h200", 1, "on_demand"}},
             {{"a", "h200", 4, "spot"}},
             {}},
        Case{"any_job_prefers_spot_over_a_better_fit",
             {{1, 0, T(1), "h200", 2}},
             {{"a", "h200", 2}, {"b", "h200", 8, "spot"}},
             {{1, {"b", "b"}}}},
        Case{"any_job_spreads_over_spot_before_one_on_demand_worker",
             {{1, 0, T(1), "h200", 3, "any"}},
             {{"o", "h200", 4, "on_demand"}, {"s1", "h200", 2, "spot"},
              {"s2", "h200", 1, "spot"}},
             {{1, {"s1", "s1", "s2"}}}},
        Case{"any_job_falls_back_to_on_demand_whole",
             {{1, 0, T(1), "h200", 3}},
             {{"o1", "h200", 2}, {"o2", "h200", 1}, {"s", "h200", 2, "spot"}},
             {{1, {"o1", "o1", "o2"}}}},
        Case{"any_job_spans_both_kinds_last",
             {{1, 0, T(1), "h200", 4, "any"}},
             {{"s", "h200", 3, "spot"}, {"o", "h200", 2, "on_demand"}},
             {{1, {"s", "s", "s", "o"}}}},
        Case{"capacity_slots_are_consumed",
             {{1, 1, T(1), "h200", 1, "spot"}, {2, 0, T(2), "h200", 1},
              {3, 0, T(3), "h200", 1, "spot"}},
             {{"o", "h200", 1}, {"s", "h200", 1, "spot"}},
             {{1, {"s"}}, {2, {"o"}}}},
        Case{"unknown_worker_capacity_gets_nothing",
             {{1, 0, T(1), "h200", 1}},
             {{"a", "h200", 4, "preemptible"}},
             {}},
        Case{"unknown_job_capacity_places_nowhere",
             {{1, 0, T(1), "h200", 1, "reserved"}, {2, 0, T(2), "h200", 1}},
             {{"a", "h200", 1}},
             {{2, {"a"}}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(CapacityMatchesTest, Table) {
  struct Row {
    std::string job, worker;
    bool want;
  };
  const Row rows[] = {
      {"", "", true},           {"", "spot", true},           {"any", "on_demand", true},
      {"any", "spot", true},    {"spot", "spot", true},       {"spot", "", false},
      {"spot", "on_demand", false}, {"on_demand", "", true},  {"on_demand", "spot", false},
      {"on_demand", "on_demand", true}, {"", "cheap", false}, {"Spot", "spot", false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(CapacityMatches(r.job, r.worker), r.want)
        << "job=\"" << r.job << "\" worker=\"" << r.worker << "\"";
  }
}

}  // namespace
}  // namespace tally::policy
