#include "common/text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

TEST(TextTest, ValidUtf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80"));
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
}

TEST(TextTest, InvalidUtf8) {
  for (const std::string bad : {
           std::string("\xff"),              // never valid
           std::string("\xc3"),              // truncated
           std::string("a\xc3(b"),           // bad continuation
           std::string("\xc0\xaf"),          // overlong '/'
           std::string("\xe0\x80\xaf"),      // overlong, 3 bytes
           std::string("\xed\xa0\x80"),      // surrogate U+D800
           std::string("\xf4\x90\x80\x80"),  // past U+10FFFF
           std::string("\x80"),              // lone continuation
       }) {
    EXPECT_FALSE(IsValidUtf8(bad)) << EscapeUnprintable(bad);
    EXPECT_THAT(UnprintableReason(bad), Optional(HasSubstr("not valid UTF-8")))
        << EscapeUnprintable(bad);
  }
}

TEST(TextTest, UnprintableNamesTheProblemAndOffset) {
  EXPECT_EQ(UnprintableReason("fine, caf\xc3\xa9"), std::nullopt);
  EXPECT_THAT(UnprintableReason(std::string("ab\0c", 4)),
              Optional(std::string("contains a NUL byte at offset 2")));
  EXPECT_THAT(UnprintableReason("\x1b[31mred"),
              Optional(std::string("contains control character U+001B at offset 0")));
  EXPECT_THAT(UnprintableReason("a\nb"), Optional(HasSubstr("U+000A")));
  EXPECT_THAT(UnprintableReason("a\x7f"), Optional(HasSubstr("U+007F")));
  EXPECT_THAT(UnprintableReason("\xc2\x9b"), Optional(HasSubstr("U+009B")));  // C1 CSI
  EXPECT_THAT(UnprintableReason("abc\xe2\x80\xae"), Optional(HasSubstr("U+202E")));
  EXPECT_THAT(UnprintableReason("x\xff"),
              Optional(std::string("is not valid UTF-8 (byte 0xff at offset 1)")));
}

TEST(TextTest, Utf8LengthCountsCodePoints) {
  EXPECT_EQ(Utf8Length(""), 0u);
  EXPECT_EQ(Utf8Length("abc"), 3u);
  EXPECT_EQ(Utf8Length("\xe6\x97\xa5\xe6\x9c\xac"), 2u);
  EXPECT_EQ(Utf8Length("\xff\xfe"), 2u);  // invalid: bytes
}

TEST(TextTest, EscapeLeavesPrintableTextAlone) {
  const std::string text = "name: caf\xc3\xa9 \\ /path \xf0\x9f\x9a\x80";
  EXPECT_EQ(EscapeUnprintable(text), text);
}

TEST(TextTest, EscapeWritesControlsAndBadBytesVisibly) {
  EXPECT_EQ(EscapeUnprintable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(EscapeUnprintable("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(EscapeUnprintable(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(EscapeUnprintable("\x7f"), "\\x7f");
  EXPECT_EQ(EscapeUnprintable("\xc2\x9b"), "\\u{009B}");
  EXPECT_EQ(EscapeUnprintable("a\xe2\x80\xae" "b"), "a\\u{202E}b");
  EXPECT_EQ(EscapeUnprintable("ok\xff\xc3"), "ok\\xff\\xc3");
  // The result is always printable.
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(UnprintableReason(EscapeUnprintable(all)), std::nullopt);
}

TEST(TextTest, QuoteForMessageEscapesAndCuts) {
  EXPECT_EQ(QuoteForMessage("h200"), "\"h200\"");
  EXPECT_EQ(QuoteForMessage("a\x1b"), "\"a\\x1b\"");
  EXPECT_EQ(QuoteForMessage(std::string(100, 'x'), 8), "\"xxxxxxxx...\" (100 bytes)");
  // The cut does not split a character: 3 x U+65E5, cut inside the second.
  EXPECT_EQ(QuoteForMessage("\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5", 4),
            "\"\xe6\x97\xa5...\" (9 bytes)");
}

}  // namespace
}  // namespace tally
