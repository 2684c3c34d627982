#include "server/auth/principal.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::auth {
namespace {

TEST(RoleTest, NamesRoundTrip) {
  for (Role role : {Role::kViewer, Role::kUser, Role::kAdmin, Role::kWorker}) {
    absl::StatusOr<Role> parsed = ParseRole(RoleName(role));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, role);
  }
  EXPECT_EQ(RoleName(Role::kViewer), "viewer");
  EXPECT_EQ(RoleName(Role::kUser), "user");
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
  EXPECT_EQ(RoleName(Role::kWorker), "worker");
}

TEST(RoleTest, ParseIsExact) {
  for (absl::string_view name :
       {"Admin", "ADMIN", " admin", "admin ", "", "root", "viewers"}) {
    absl::StatusOr<Role> parsed = ParseRole(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::HasSubstr("use one of admin, user, viewer, worker"));
  }
}

}  // namespace
}  // namespace tally::auth
