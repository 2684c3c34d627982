#include "common/controller_list.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseControllerListTest, OneAddress) {
  auto list = ParseControllerList("127.0.0.1:50051", "--controller");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_THAT(*list, ElementsAre("127.0.0.1:50051"));
}

TEST(ParseControllerListTest, SeveralInOrderWithBlanksDropped) {
  auto list = ParseControllerList(" tally-0.tally:50051 , tally-1.tally:50051,[::1]:7",
                                  "--controller");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_THAT(*list, ElementsAre("tally-0.tally:50051", "tally-1.tally:50051", "[::1]:7"));
}

TEST(ParseControllerListTest, GrpcTargetsWithASchemeAreKept) {
  auto list = ParseControllerList("dns:///tally.svc:50051,unix:/run/tally.sock,ipv4:10.0.0.1:5",
                                  "TALLY_CONTROLLER");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_THAT(*list,
              ElementsAre("dns:///tally.svc:50051", "unix:/run/tally.sock", "ipv4:10.0.0.1:5"));
}

struct BadCase {
  std::string value;
  std::string want;  // a part of the message
};

class ParseControllerListBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseControllerListBadTest, RefusedNamingSourceAndAddress) {
  auto list = ParseControllerList(GetParam().value, "--controller");
  ASSERT_FALSE(list.ok()) << GetParam().value;
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(list.status().message(), HasSubstr("--controller"));
  EXPECT_THAT(list.status().message(), HasSubstr(GetParam().want));
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseControllerListBadTest,
    ::testing::Values(BadCase{"", "no address"}, BadCase{"  ", "no address"},
                      BadCase{"a:1,,b:2", "address 2 of 3 is empty"},
                      BadCase{"a:1,", "address 2 of 2 is empty"},
                      BadCase{"tallyd", "\"tallyd\" has no port"},
                      BadCase{"a:1,tallyd", "address 2 of 2: \"tallyd\" has no port"},
                      BadCase{":50051", "has no host"},
                      BadCase{"host:", "has port \"\""},
                      BadCase{"host:http", "has port \"http\""},
                      BadCase{"host:0", "from 1 to 65535"},
                      BadCase{"host:65536", "from 1 to 65535"},
                      BadCase{"host:0000050051", "from 1 to 65535"},
                      BadCase{"::1:50051", "not in brackets"},
                      BadCase{"http://tally:50051",
                              "\"http://tally:50051\" is a URL: tallyd is reached at "
                              "HOST:PORT without \"http://\" (give \"tally:50051\"; for "
                              "TLS, set ca_cert)"},
                      BadCase{"https://tally.example.com:443/", "(give \"tally.example.com:443\""},
                      BadCase{"[::1:50051", "without ']'"},
                      BadCase{"[::1]", "no port after the IPv6 host"},
                      BadCase{"[zz]:1", "bad IPv6 host"},
                      BadCase{"ho st:1", "blanks or unprintable"},
                      BadCase{"a:1,b\x01:2", "unprintable"},
                      BadCase{"h/ost:1", "characters other than"},
                      BadCase{"dns:", "no address after its scheme"},
                      BadCase{"a:1,b:2,a:1", "\"a:1\" is given twice"}));

}  // namespace
}  // namespace tally
