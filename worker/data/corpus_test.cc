#include "worker/data/corpus.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tally::data {
namespace {

std::string WriteTemp(const std::string& content) {
  char path[] = "/tmp/tally_corpus_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

absl::Status Read(const std::string& content, CorpusOptions o,
                  std::vector<std::string>* docs, std::vector<int64_t>* lines = nullptr) {
  const std::string path = WriteTemp(content);
  return ReadCorpusFile(path, o, [&](absl::string_view text, const DocumentSource& w) {
    docs->emplace_back(text);
    if (lines) lines->push_back(w.first_line);
    return absl::OkStatus();
  });
}

TEST(CorpusTest, SeparatorSplitsFortunes) {
  std::vector<std::string> docs;
  std::vector<int64_t> lines;
  ASSERT_TRUE(Read("one\nline two\n%\n\n%\nthree\r\n  %  \nfour\n", {}, &docs, &lines).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"one\nline two", "three", "four"}));
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 6, 8}));
}

TEST(CorpusTest, BlankLinesAndWholeFile) {
  std::vector<std::string> docs;
  CorpusOptions o;
  o.format = CorpusFormat::kTextBlankLine;
  ASSERT_TRUE(Read("a\nb\n\n\nc\n", o, &docs).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"a\nb", "c"}));
  docs.clear();
  o.format = CorpusFormat::kTextFile;
  ASSERT_TRUE(Read("\na\n\nb\n\n", o, &docs).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"a\n\nb"}));
}

TEST(CorpusTest, JsonlTakesTheNamedField) {
  std::vector<std::string> docs;
  CorpusOptions o;
  o.format = CorpusFormat::kJsonl;
  o.field = "body";
  ASSERT_TRUE(Read("{\"body\": \"x\\ny\"}\n\n{\"body\": \"z\", \"n\": 1}\n", o, &docs).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"x\ny", "z"}));
}

TEST(CorpusTest, BadInputNamesFileAndLine) {
  std::vector<std::string> docs;
  CorpusOptions o;
  o.format = CorpusFormat::kJsonl;
  absl::Status s = Read("{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n", o, &docs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(":2: no string field \"text\""), std::string::npos) << s;
  s = Read("{\"text\": \"ok\"}\n{not json\n", o, &docs);
  EXPECT_NE(s.message().find(":2: not a valid JSON line"), std::string::npos) << s;
  s = Read("fine\n%\nbad \xff byte\n", {}, &docs);
  EXPECT_NE(s.message().find(":3: byte 5 is not valid UTF-8"), std::string::npos) << s;
  s = ReadCorpusFile("/nonexistent/corpus.txt", {},
                     [](absl::string_view, const DocumentSource&) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

TEST(CorpusTest, Utf8Validation) {
  EXPECT_EQ(FindInvalidUtf8("plain"), absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xc3"), 2u);          // truncated
  EXPECT_EQ(FindInvalidUtf8("\xc0\xaf"), 0u);        // overlong
  EXPECT_EQ(FindInvalidUtf8("x\xed\xa0\x80"), 1u);   // surrogate
  EXPECT_EQ(FindInvalidUtf8("\x80"), 0u);            // stray continuation
}

}  // namespace
}  // namespace tally::data
