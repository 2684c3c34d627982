#include "server/api/priority_caps.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

using ::testing::HasSubstr;

auth::Principal Caller(const std::string& tenant, auth::Role role = auth::Role::kUser,
                       const std::string& method = "token") {
  auth::Principal p;
  p.name = "someone";
  p.tenant = tenant;
  p.role = role;
  p.method = method;
  return p;
}

tally::v1::JobSpec WithPriority(int priority) {
  tally::v1::JobSpec spec;
  spec.set_priority(priority);
  return spec;
}

TEST(PriorityCapsTest, ATenantsJobsAreCapped) {
  config::TenancyPolicy policy;
  policy.tenant_max_priority["research"] = 500;
  PriorityCaps caps(policy);
  EXPECT_TRUE(caps.CheckJob(Caller("dev"), WithPriority(100)).ok());
  absl::Status s = caps.CheckJob(Caller("dev"), WithPriority(1000));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.priority: 1000 is above the maximum of 100"));
  EXPECT_TRUE(caps.CheckJob(Caller("research"), WithPriority(500)).ok());
  // A tenant admin is capped like its tenant; a global admin and the
  // anonymous admin (no authentication) are not.
  EXPECT_FALSE(caps.CheckJob(Caller("dev", auth::Role::kAdmin), WithPriority(101)).ok());
  EXPECT_TRUE(caps.CheckJob(Caller("", auth::Role::kAdmin), WithPriority(1000)).ok());
  EXPECT_TRUE(caps.CheckJob(Caller("", auth::Role::kAdmin, "anonymous"), WithPriority(1000)).ok());

  policy.max_priority = 5;
  caps.Set(policy);
  EXPECT_FALSE(caps.CheckJob(Caller("dev"), WithPriority(6)).ok());
}

TEST(PriorityCapsTest, EveryExperimentVariantIsChecked) {
  PriorityCaps caps;
  tally::v1::ExperimentSpec e;
  e.mutable_base()->set_priority(10);
  e.add_variants()->set_name("a");
  tally::v1::ExperimentVariant* fast = e.add_variants();
  fast->set_name("fast");
  (*fast->mutable_overrides()->mutable_fields())["priority"].set_number_value(900);
  absl::Status s = caps.CheckExperiment(Caller("dev"), e);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("spec.variants[1] (fast).priority: 900 is above the maximum of 100"));
  (*fast->mutable_overrides()->mutable_fields())["priority"].set_number_value(50);
  EXPECT_TRUE(caps.CheckExperiment(Caller("dev"), e).ok());
  e.mutable_base()->set_priority(101);
  EXPECT_THAT(caps.CheckExperiment(Caller("dev"), e).message(),
              HasSubstr("spec.base.priority: 101"));
}

}  // namespace
}  // namespace tally::api
