#include "cli/tallyctl/suggest.h"

#include "gtest/gtest.h"

namespace tally::cli {
namespace {

constexpr const char* kCommands[] = {"experiment", "submit", "list",     "get",  "watch",
                                     "cancel",     "checkpoints", "cost", "estimate",
                                     "validate",   "token",  "help"};

TEST(ClosestCommandTest, PicksTheNearestCommand) {
  EXPECT_EQ(ClosestCommand("sumbit", kCommands), "submit");
  EXPECT_EQ(ClosestCommand("lst", kCommands), "list");
  EXPECT_EQ(ClosestCommand("wacth", kCommands), "watch");
  EXPECT_EQ(ClosestCommand("GET", kCommands), "get");
  EXPECT_EQ(ClosestCommand("experiments", kCommands), "experiment");
  EXPECT_EQ(ClosestCommand("checkpoint", kCommands), "checkpoints");
  EXPECT_EQ(ClosestCommand("check", kCommands), "checkpoints");
  EXPECT_EQ(ClosestCommand("tokens", kCommands), "token");
}

TEST(ClosestCommandTest, NothingWhenNothingIsNear) {
  EXPECT_EQ(ClosestCommand("frobnicate", kCommands), "");
  EXPECT_EQ(ClosestCommand("", kCommands), "");
  EXPECT_EQ(ClosestCommand("zzzzzz", kCommands), "");
}

TEST(UnknownCommandMessageTest, NamesTheWordTheSuggestionAndHelp) {
  EXPECT_EQ(UnknownCommandMessage("sumbit", kCommands),
            "tallyctl: unknown command \"sumbit\"; did you mean \"submit\"? "
            "(tallyctl help lists every command)\n");
  EXPECT_EQ(UnknownCommandMessage("frobnicate", kCommands),
            "tallyctl: unknown command \"frobnicate\" (tallyctl help lists every command)\n");
}

TEST(UnknownCommandMessageTest, EscapesControlCharacters) {
  const std::string m = UnknownCommandMessage("a\x1b[2Jb", kCommands);
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
}

}  // namespace
}  // namespace tally::cli
