#include "worker/config/worker_options.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tally::worker {
namespace {

TEST(WorkerOptionsTest, DefaultsPass) {
  WorkerOptions o;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_EQ(*o.Controllers(), "127.0.0.1:50051");
  EXPECT_EQ(o.ExitWhenIdle(), absl::ZeroDuration());
  o.exit_when_idle = "90s";
  EXPECT_EQ(o.ExitWhenIdle(), absl::Seconds(90));
}

TEST(WorkerOptionsTest, EachRefusalNamesItsFlag) {
  struct Case {
    std::function<void(WorkerOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](WorkerOptions& o) { o.controller = "no-port"; }, "--controller"},
      {[](WorkerOptions& o) {
         o.controller = "bad";
         o.controller_source = "$TALLY_CONTROLLER";
       },
       "$TALLY_CONTROLLER"},
      {[](WorkerOptions& o) { o.device = "tpu"; }, "--device: must be cpu or cuda:N, got \"tpu\""},
      {[](WorkerOptions& o) { o.slots = 0; }, "--slots: must be between 1 and 1024, got 0"},
      {[](WorkerOptions& o) { o.slots = 1025; }, "--slots: must be between 1 and 1024, got 1025"},
      {[](WorkerOptions& o) { o.capacity = "reserved"; },
       "--capacity: must be spot or on_demand, got \"reserved\""},
      {[](WorkerOptions& o) { o.preemption_deadline = absl::ZeroDuration(); },
       "--preemption_deadline: must be > 0"},
      {[](WorkerOptions& o) { o.preemption_deadline = absl::InfiniteDuration(); },
       "--preemption_deadline: must be > 0"},
      {[](WorkerOptions& o) { o.exit_when_idle = "90"; },
       "--exit_when_idle: must be a duration of 0 or more with its unit, such as 90s, 5m or 1h "
       "(0: never), got \"90\""},
      {[](WorkerOptions& o) { o.exit_when_idle = "-5s"; }, "--exit_when_idle"},
      {[](WorkerOptions& o) { o.exit_when_idle = "inf"; }, "--exit_when_idle"},
      {[](WorkerOptions& o) { o.rendezvous_port = -1; },
       "--rendezvous_port: must be 0 or a port with room for --slots ports below 65536, got -1"},
      {[](WorkerOptions& o) {
         o.rendezvous_port = 65535;
         o.slots = 2;
       },
       "--rendezvous_port"},
      {[](WorkerOptions& o) { o.collective_timeout_seconds = 0; },
       "--collective_timeout: must be > 0 seconds"},
      {[](WorkerOptions& o) { o.test_fp8_overflow_fraction = 1.5; },
       "--testonly_fp8_overflow_fraction: must be between 0 and 1, got 1.5"},
      {[](WorkerOptions& o) { o.test_fp8_overflow_fraction = std::nan(""); },
       "--testonly_fp8_overflow_fraction"},
      {[](WorkerOptions& o) { o.test_moe_collapse_expert = -2; },
       "--testonly_moe_collapse_expert: must be -1 (off) or an expert index, got -2"},
      {[](WorkerOptions& o) { o.test_preempt_checkpoint_delay = -absl::Seconds(1); },
       "--testonly_preempt_checkpoint_delay: must be a finite duration >= 0, got -1s"},
      {[](WorkerOptions& o) { o.threads = -1; }, "--threads: must be >= 0, got -1"},
  };
  for (const Case& c : cases) {
    WorkerOptions o;
    c.set(o);
    absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos)
        << "wanted \"" << c.message << "\" in: " << s.message();
  }
}

TEST(WorkerOptionsTest, TheControllerListIsNormalised) {
  WorkerOptions o;
  o.controller = "a:1, b:2";
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_EQ(*o.Controllers(), "a:1,b:2");
}

}  // namespace
}  // namespace tally::worker
