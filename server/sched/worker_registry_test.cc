#include "server/sched/worker_registry.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

WorkerState& Connected(WorkerRegistry& r, const std::string& id, int slots,
                       const std::string& gpu = "h100") {
  WorkerState& w = r.Add(id);
  w.rec.set_gpu_type(gpu);
  w.rec.set_slots(slots);
  w.connected = true;
  w.last_seen = kNow;
  return w;
}

TEST(WorkerRegistryTest, SlotsAreHeldPerAttemptAndReleasedRankByRank) {
  WorkerRegistry r(absl::Seconds(10));
  Connected(r, "w1", 4);
  r.Hold("w1", {7, 1}, 2);  // two ranks of jobs/7 attempt 1
  r.AddRank("w1", {8, 1});
  EXPECT_EQ(r.Held("w1", {7, 1}), 2);
  EXPECT_EQ(r.Find("w1")->Used(), 3);
  r.ReleaseOne("w1", {7, 1});
  EXPECT_EQ(r.Held("w1", {7, 1}), 1);
  r.ReleaseOne("w1", {7, 1});
  EXPECT_EQ(r.Held("w1", {7, 1}), 0);
  EXPECT_EQ(r.Find("w1")->held.count({7, 1}), 0u) << "no entry at 0";
  r.Release("w1", {8, 1});
  EXPECT_EQ(r.Find("w1")->Used(), 0);
  // Unknown workers and attempts: nothing happens.
  r.Release("nobody", {1, 1});
  r.ReleaseOne("nobody", {1, 1});
  EXPECT_EQ(r.Held("nobody", {1, 1}), 0);
  EXPECT_EQ(r.Find("nobody"), nullptr);
  // A hold for a worker not seen yet (a recovered attempt) makes it known.
  r.Hold("w2", {9, 3}, 1);
  ASSERT_NE(r.Find("w2"), nullptr);
  EXPECT_EQ(r.Find("w2")->rec.worker_id(), "w2");
  EXPECT_FALSE(r.Find("w2")->connected);
}

TEST(WorkerRegistryTest, PlaceableMeansConnectedHeardFromAndNotGoingAway) {
  WorkerRegistry r(absl::Seconds(10));
  WorkerState& w = Connected(r, "w1", 2);
  EXPECT_TRUE(r.Placeable(w, kNow));
  EXPECT_TRUE(r.Live("w1", kNow + absl::Seconds(9)));
  EXPECT_TRUE(r.Placeable(w, kNow + absl::Seconds(10)));
  EXPECT_FALSE(r.Live("w1", kNow + absl::Seconds(10))) << "live: strictly within the timeout";
  EXPECT_FALSE(r.Placeable(w, kNow + absl::Seconds(11)));
  w.draining = "sigterm";
  EXPECT_FALSE(r.Placeable(w, kNow));
  EXPECT_TRUE(r.Live("w1", kNow)) << "a worker going away is still live";
  w.draining.clear();
  w.connected = false;
  EXPECT_FALSE(r.Placeable(w, kNow));
  EXPECT_FALSE(r.Live("w1", kNow));
  EXPECT_FALSE(r.Connected("w1"));
  EXPECT_FALSE(r.Live("nobody", kNow));
}

TEST(WorkerRegistryTest, FreeSlotsAndIdleCountOnlyPlaceableWorkers) {
  WorkerRegistry r(absl::Seconds(10));
  Connected(r, "a", 4).rec.set_capacity("spot");
  r.Hold("a", {1, 1}, 3);
  Connected(r, "b", 2);
  Connected(r, "c", 8).draining = "idle";
  Connected(r, "d", 1, "cpu").connected = false;
  const std::vector<policy::WorkerSlots> free = r.FreeSlots(kNow);
  ASSERT_EQ(free.size(), 2u);
  EXPECT_EQ(free[0].worker_id, "a");
  EXPECT_EQ(free[0].free_slots, 1);
  EXPECT_EQ(free[0].total_slots, 4);
  EXPECT_EQ(free[0].capacity, "spot");
  EXPECT_EQ(free[1].worker_id, "b");
  EXPECT_EQ(free[1].free_slots, 2);
  // b runs nothing and takes work; a is busy, c is going away, d is gone:
  // their types are listed at 0.
  EXPECT_THAT(r.Idle(kNow), ElementsAre(Pair("cpu", 0), Pair("h100", 1)));
}

TEST(WorkerRegistryTest, OnlyAWorkerWithARendezvousAddressLeadsAGang) {
  WorkerRegistry r(absl::Seconds(10));
  Connected(r, "w1", 2);
  EXPECT_FALSE(r.CanLead("w1"));
  r.Find("w1")->rec.set_rendezvous_host("10.0.0.1");
  EXPECT_FALSE(r.CanLead("w1")) << "no port";
  r.Find("w1")->rec.set_rendezvous_port(29500);
  EXPECT_TRUE(r.CanLead("w1"));
  EXPECT_FALSE(r.CanLead("nobody"));
}

TEST(WorkerRegistryTest, ViewsIdsAndForget) {
  WorkerRegistry r(absl::Seconds(10));
  Connected(r, "b", 2).draining = "sigterm";
  Connected(r, "a", 1);
  r.Hold("b", {4, 2}, 1);
  EXPECT_THAT(r.Ids(), ElementsAre("a", "b"));
  const std::vector<WorkerView> views = r.Views();
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[1].record.worker_id(), "b");
  EXPECT_EQ(views[1].used_slots, 1);
  EXPECT_EQ(views[1].draining, "sigterm");
  EXPECT_TRUE(views[1].connected);
  r.Forget("b");
  EXPECT_THAT(r.Ids(), ElementsAre("a"));
}

TEST(WorkerRegistryGenerationTest, EachSessionGetsANewerGeneration) {
  WorkerRegistry workers(absl::Seconds(10));
  const int64_t first = workers.NewGeneration();
  const int64_t second = workers.NewGeneration();
  EXPECT_GT(first, 0);
  EXPECT_GT(second, first);
}

}  // namespace
}  // namespace tally::sched
