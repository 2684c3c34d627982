#include "worker/data/corpus.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::data {
namespace {

using ::testing::HasSubstr;

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

TEST(CorpusTest, BytesAndFileReadAlike) {
  const std::string content = "a\n%\nb\nc\n%\n\nd";  // no final newline
  std::vector<std::string> from_file, from_bytes;
  ASSERT_TRUE(Read(content, {}, &from_file).ok());
  ASSERT_TRUE(ReadCorpusBytes(content, "mem", {},
                              [&](absl::string_view text, const DocumentSource&) {
                                from_bytes.emplace_back(text);
                                return absl::OkStatus();
                              })
                  .ok());
  EXPECT_EQ(from_file, (std::vector<std::string>{"a", "b\nc", "d"}));
  EXPECT_EQ(from_bytes, from_file);
}

absl::Status ReadBytes(const std::string& content, const CorpusOptions& o) {
  return ReadCorpusBytes(content, "corpus.txt", o,
                         [](absl::string_view, const DocumentSource&) { return absl::OkStatus(); });
}

TEST(CorpusTest, LongLinesAreRefusedNamingTheLine) {
  CorpusOptions o;
  o.max_line_bytes = 100;
  EXPECT_TRUE(ReadBytes("short\n" + std::string(100, 'x') + "\n", o).ok());
  // Longer than the reader's buffer too, so the limit holds across refills.
  for (const size_t n : {size_t{101}, size_t{200000}}) {
    absl::Status s = ReadBytes("short\n%\n" + std::string(n, 'x') + "\nmore\n", o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("corpus.txt:3: line is longer than 100 bytes"),
              std::string::npos) << s;
  }
  o.format = CorpusFormat::kJsonl;
  absl::Status s = ReadBytes("{\"text\": \"" + std::string(200, 'y') + "\"}\n", o);
  EXPECT_NE(s.message().find("corpus.txt:1: line is longer than 100 bytes"), std::string::npos)
      << s;
}

TEST(CorpusTest, LongDocumentsAreRefusedNamingWhereTheyStart) {
  CorpusOptions o;
  o.max_doc_bytes = 10;
  EXPECT_TRUE(ReadBytes("12345\n1234\n%\n", o).ok());  // 10 bytes with the newline
  absl::Status s = ReadBytes("ok\n%\n\n12345\n12345\n%\n", o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("corpus.txt:4: the document starting here is longer than 10 "
                             "bytes (at line 5"),
            std::string::npos) << s;
  o.format = CorpusFormat::kTextFile;
  s = ReadBytes(std::string(1000, 'z') + "\n", o);
  EXPECT_NE(s.message().find("corpus.txt:1: the document starting here"), std::string::npos)
      << s;
  o.format = CorpusFormat::kJsonl;
  s = ReadBytes("{\"text\": \"short\"}\n{\"text\": \"much too long\"}\n", o);
  EXPECT_NE(s.message().find("corpus.txt:2: the document is 13 bytes, longer than 10"),
            std::string::npos) << s;
}

TEST(CorpusTest, JsonlNestingIsBoundedAndOtherMembersAreSkipped) {
  CorpusOptions o;
  o.format = CorpusFormat::kJsonl;
  absl::Status s = ReadBytes("{\"text\": \"a\", \"x\": " + std::string(100000, '[') + "}\n", o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("corpus.txt:1: JSON nested deeper than"), std::string::npos) << s;
  std::vector<std::string> docs;
  ASSERT_TRUE(Read("{\"meta\": {\"a\": [[1], {\"b\": 2}]}, \"text\": \"kept\"}\n", o, &docs).ok());
  EXPECT_EQ(docs, (std::vector<std::string>{"kept"}));
  s = ReadBytes("{\"text\": {\"nested\": \"no\"}}\n", o);
  EXPECT_NE(s.message().find(":1: no string field \"text\""), std::string::npos) << s;
  s = ReadBytes("[\"text\", 1]\n", o);
  EXPECT_NE(s.message().find(":1: expected a JSON object, got array"), std::string::npos) << s;
}

TEST(CorpusTest, ArbitraryBytesNeverCrash) {
  std::mt19937 rng(3);
  const std::string alphabet = "{}[]\":,\\ \n\r%abtex\xc3\xa9\xff0";
  for (CorpusFormat f : {CorpusFormat::kTextFile, CorpusFormat::kTextSeparator,
                         CorpusFormat::kTextBlankLine, CorpusFormat::kJsonl}) {
    CorpusOptions o;
    o.format = f;
    o.max_line_bytes = 64;
    o.max_doc_bytes = 128;
    for (int i = 0; i < 500; ++i) {
      std::string s(rng() % 300, ' ');
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
      (void)ReadBytes(s, o);
    }
  }
}

TEST(CorpusTest, Utf8Validation) {
  EXPECT_EQ(FindInvalidUtf8("plain"), absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xc3"), 2u);          // truncated
  EXPECT_EQ(FindInvalidUtf8("\xc0\xaf"), 0u);        // overlong
  EXPECT_EQ(FindInvalidUtf8("x\xed\xa0\x80"), 1u);   // surrogate
  EXPECT_EQ(FindInvalidUtf8("\x80"), 0u);            // stray continuation
}

TEST(CorpusTest, TokenIdsAreReadAndCheckedAgainstTheVocabulary) {
  CorpusOptions o;
  o.format = CorpusFormat::kJsonl;
  o.field = "input_ids";
  std::vector<std::vector<uint32_t>> docs;
  auto collect = [&](absl::Span<const uint32_t> ids, const DocumentSource&) {
    docs.emplace_back(ids.begin(), ids.end());
    return absl::OkStatus();
  };
  ASSERT_TRUE(ReadTokenIdsBytes("{\"input_ids\": [1, 2, 99], \"text\": \"x\"}\n\n"
                                "{\"input_ids\": []}\n{\"input_ids\": [0]}\n",
                                "ids.jsonl", o, 100, collect)
                  .ok());
  ASSERT_EQ(docs.size(), 2u);  // the empty array is skipped
  EXPECT_EQ(docs[0], (std::vector<uint32_t>{1, 2, 99}));
  struct Case {
    const char* input;
    const char* message;
  };
  for (const Case& c : {
           Case{"{\"input_ids\": [1, 100]}", "ids.jsonl:1: \"input_ids\"[1] is 100, outside"},
           Case{"{\"input_ids\": [3]}\n{\"input_ids\": [-1]}",
                "ids.jsonl:2: \"input_ids\"[0] is -1"},
           Case{"{\"input_ids\": [1.5]}", "not an integer token id"},
           Case{"{\"input_ids\": [true]}", "not an integer token id"},
           Case{"{\"input_ids\": [18446744073709551615]}", "outside the vocabulary"},
           Case{"{\"input_ids\": \"1 2\"}", "holding an array of token ids"},
           Case{"[1, 2]", "expected a JSON object"},
           Case{"{\"input_ids\": [[1]]}", "not an integer token id"},
       }) {
    const absl::Status s = ReadTokenIdsBytes(c.input, "ids.jsonl", o, 100, collect);
    ASSERT_FALSE(s.ok()) << c.input;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.input;
  }
  // Read as text, an array of ids says what to do.
  const absl::Status s =
      ReadCorpusBytes("{\"input_ids\": [1]}", "ids.jsonl", o,
                      [](absl::string_view, const DocumentSource&) { return absl::OkStatus(); });
  EXPECT_THAT(std::string(s.message()), HasSubstr("give --vocab_size"));
}

}  // namespace
}  // namespace tally::data
