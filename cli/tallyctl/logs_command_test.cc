#include "cli/tallyctl/logs_command.h"

#include "gtest/gtest.h"

namespace tally::cli {
namespace {

tally::v1::LogLine Line(const std::string& text, const std::string& source = "trainer") {
  tally::v1::LogLine l;
  l.mutable_time()->set_seconds(1765028401);  // 2025-12-06 13:40:01 UTC
  l.mutable_time()->set_nanos(123000000);
  l.set_attempt(2);
  l.set_rank(1);
  l.set_level("warning");
  l.set_source(source);
  l.set_text(text);
  return l;
}

TEST(LogLineText, TimeAttemptRankLevelAndText) {
  EXPECT_EQ(LogLineText(Line("step 10 loss 2.5"), absl::UTCTimeZone()),
            "2025-12-06 13:40:01.123 a2 r1 warning step 10 loss 2.5");
  EXPECT_EQ(LogLineText(Line("attempt 2 started", "worker"), absl::UTCTimeZone()),
            "2025-12-06 13:40:01.123 a2 r1 warning [worker] attempt 2 started");
}

TEST(LogLineText, ControlCharactersAreEscaped) {
  const std::string shown =
      LogLineText(Line("\x1b[2J\x1b]0;owned\x07 bell\r\tok\xc2\x9b"), absl::UTCTimeZone());
  for (char ch : shown) {
    EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) << shown;
  }
  EXPECT_NE(shown.find("\\x1b[2J"), std::string::npos) << shown;
  EXPECT_NE(shown.find("\\r\\tok"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("\xc2\x9b"), std::string::npos) << shown;  // C1 CSI escaped too
}

}  // namespace
}  // namespace tally::cli
