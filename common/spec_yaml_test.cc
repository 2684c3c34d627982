#include "common/spec_yaml.h"

#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec_validation.h"
#include "common/text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(SpecYamlTest, ParsesNestedFieldsEnumsAndLabels) {
  auto spec = ParseJobSpecYaml(R"(
display_name: tiny
model: {num_layers: 2, d_model: 64, num_heads: 4}
precision:
  compute: fp8
  fp8_recipe: FP8_RECIPE_CURRENT
data:
  train_path: /data/x
  seq_len: 256
  packing: pad_to_seq_len
training: {max_steps: 10, seed: 7}
optimizer: {lr: 1e-3}
labels: {team: research}
priority: -3
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().num_layers(), 2);
  EXPECT_EQ(spec->precision().compute(), tally::v1::PRECISION_FP8);
  EXPECT_EQ(spec->precision().fp8_recipe(), tally::v1::FP8_RECIPE_CURRENT);
  EXPECT_EQ(spec->data().packing(), tally::v1::PACKING_MODE_PAD_TO_SEQ_LEN);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-3);
  EXPECT_EQ(spec->training().seed(), 7u);
  EXPECT_EQ(spec->labels().at("team"), "research");
  EXPECT_EQ(spec->priority(), -3);
}

TEST(SpecYamlTest, JsonIsAccepted) {
  auto spec = ParseJobSpecYaml(R"({"model": {"numLayers": 3}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().num_layers(), 3);
}

struct BadYaml {
  const char* text;
  const char* expect;
};

void PrintTo(const BadYaml& c, std::ostream* os) { *os << c.text; }


class BadYamlTest : public ::testing::TestWithParam<BadYaml> {};

TEST_P(BadYamlTest, IsRejectedNamingTheField) {
  auto spec = ParseJobSpecYaml(GetParam().text);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadYamlTest,
    ::testing::Values(
        BadYaml{"model: {nmu_layers: 2}", "spec.model.nmu_layers (line 1): unknown field"},
        BadYaml{"bogus: 1", "spec.bogus"},
        BadYaml{"model: {num_layers: two}", "spec.model.num_layers (line 1): expected an integer"},
        BadYaml{"model: {num_layers: 3000000000}", "spec.model.num_layers"},
        BadYaml{"precision: {compute: fp4}", "allowed: fp32, bf16, fp8"},
        BadYaml{"model: [1, 2]", "spec.model (line 1): expected a mapping"},
        BadYaml{"optimizer: {lr: .nan}", "spec.optimizer.lr"},
        BadYaml{"labels: [a]", "spec.labels"},
        BadYaml{"model: {num_layers: 2", "not valid YAML"},
        BadYaml{"- 1\n- 2", "spec (line 1): expected a mapping"},
        // Anchors and aliases are refused where they appear, expanded or not.
        BadYaml{"display_name: &n tiny\nlabels: {a: *n}",
                "spec (line 1): anchors (&name) and aliases (*name) are not allowed"},
        BadYaml{"labels: {a: *n}", "spec: not valid YAML (line 1)"},
        // Duplicate keys name both lines, under either spelling of a field.
        BadYaml{"display_name: a\ndisplay_name: b",
                "spec.display_name (lines 1 and 2): given twice; keep one"},
        BadYaml{"model:\n  num_layers: 2\n  numLayers: 3\n",
                "spec.model.num_layers (lines 2 and 3): \"num_layers\" and "
                "\"numLayers\" name the same field"},
        BadYaml{"model:\nmodel: {num_layers: 2}", "spec.model (lines 1 and 2)"},
        BadYaml{"labels:\n  team: a\n  team: b\n",
                "spec.labels[\"team\"] (lines 2 and 3): the key is given twice"},
        BadYaml{R"({"model": {"numLayers": 2, "num_layers": 3}})",
                "spec.model.num_layers (lines 1 and 1): \"numLayers\" and \"num_layers\""},
        BadYaml{R"({"labels": {"a": "x", "a": "y"}})", "spec.labels[\"a\"] (lines 1 and 1)"},
        // One document per file.
        BadYaml{"display_name: a\n---\ndisplay_name: b\n",
                "spec (line 2): a second YAML document starts here"},
        BadYaml{"display_name: a\n...\nbogus\n", "a second YAML document"},
        BadYaml{"? [a, b]\n: 1\n", "spec (line 1): a list or mapping is used as a key"},
        BadYaml{"~: 1", "spec (line 1): a key is missing or empty"},
        BadYaml{"labels: {~: x}", "spec.labels (line 1): a key is missing or empty"},
        BadYaml{"labels: {a: }", "spec.labels[\"a\"] (line 1): expected a single value, got nothing"}));

TEST(SpecYamlTest, AliasBombIsRefusedAtItsFirstAnchor) {
  // Each level lists the previous one ten times: 10^n values once expanded.
  std::string bomb = "display_name: bomb\na0: &a0 [x,x,x,x,x,x,x,x,x,x]\n";
  for (int i = 1; i < 40; ++i) {
    absl::StrAppend(&bomb, "a", i, ": &a", i, " [",
                    absl::StrJoin(std::vector<std::string>(10, absl::StrCat("*a", i - 1)), ","),
                    "]\n");
  }
  auto spec = ParseJobSpecYaml(bomb, "bomb.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("bomb.yaml: spec (line 2): anchors (&name) and aliases"));
}

TEST(SpecYamlTest, DeepNestingIsRefusedWithoutRecursingIntoIt) {
  struct Nest {
    std::string open, close;
  };
  for (const Nest& nest : {Nest{"[", "]"}, Nest{"{a: ", "}"}, Nest{"- ", ""}}) {
    for (const int depth : {kMaxSpecDepth + 1, 40000}) {
      std::string deep = "labels:\n  ";
      for (int i = 0; i < depth; ++i) deep += nest.open;
      deep += "x";
      for (int i = 0; i < depth; ++i) deep += nest.close;
      auto spec = ParseJobSpecYaml(deep);
      ASSERT_FALSE(spec.ok()) << nest.open << depth;
      EXPECT_THAT(std::string(spec.status().message()),
                  HasSubstr(absl::StrCat("spec (line 2): nested more than ", kMaxSpecDepth,
                                         " levels deep")))
          << nest.open << depth;
    }
  }
}

TEST(SpecYamlTest, TooManyValuesAreRefused) {
  std::string many = "labels: [";
  for (int i = 0; i < kMaxSpecValues + 10; ++i) many += "1,";
  many += "1]";
  auto spec = ParseJobSpecYaml(many);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr(absl::StrCat("more than ", kMaxSpecValues, " values")));
}

TEST(SpecYamlTest, InputOverTheSizeLimitIsRefusedUnread) {
  // Valid YAML (one comment line) one byte over the limit.
  std::string big = "#" + std::string(kMaxSpecBytes, 'x');
  auto spec = ParseJobSpecYaml(big, "big.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("big.yaml: spec: the input is larger than 256 KiB"));

  std::istringstream stream(big + std::string(kMaxSpecBytes, 'x'));
  spec = ReadJobSpecStream(stream, "<stdin>");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("<stdin>: is larger than 256 KiB"));
  // It stopped one byte past the limit.
  EXPECT_EQ(stream.tellg(), static_cast<std::streampos>(kMaxSpecBytes + 1));

  std::istringstream at_limit("#" + std::string(kMaxSpecBytes - 1, 'x'));
  EXPECT_TRUE(ReadJobSpecStream(at_limit, "<stdin>").ok());
}

TEST(SpecYamlTest, MessagesNameTheSource) {
  auto spec = ParseJobSpecYaml("bogus: 1", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("job.yaml: spec.bogus (line 1): unknown field"));
  EXPECT_EQ(ReadJobSpecFile("/nonexistent/job.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SpecYamlTest, UserTextInMessagesIsEscaped) {
  for (const std::string text : {std::string("\"\x1b[2J\": 1"),
                                 std::string("precision: {compute: \"\x1b[31m\"}"),
                                 std::string("model: {num_layers: \"\\x9b1\"}"),
                                 std::string("labels: {\"\\u202e\": [1]}")}) {
    auto spec = ParseJobSpecYaml(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(UnprintableReason(spec.status().message()), std::nullopt)
        << EscapeUnprintable(spec.status().message());
  }
}

TEST(SpecYamlTest, StringsAreReadAsWrittenForValidationToJudge) {
  // The reader keeps bytes as they are; ValidateJobSpec refuses the bad ones.
  auto spec = ParseJobSpecYaml("display_name: \"a\\0b\"\ndata: {train_path: \"\\e\"}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->display_name(), std::string("a\0b", 3));
  EXPECT_EQ(spec->data().train_path(), "\x1b");
}

// Any bytes: an answer, never a crash or a hang; a refusal is
// INVALID_ARGUMENT with a message, and so is a spec that validation refuses.
// Inputs are random bytes, random splices of YAML fragments and random edits
// of a good spec, from a fixed seed.
TEST(SpecYamlTest, AnyBytesGetAnAnswer) {
  const std::vector<std::string> pieces = {
      "model:", " {", "}", "[", "]", "num_layers: 2", "numLayers", ": ", ", ", "\n",
      "  ", "- ", "&a ", "*a", "---\n", "...\n", "? ", "\"", "'", "\\u0000", "\\x",
      "!!str ", "!!binary ", "%YAML 1.2\n", "#", "labels:", "~", "null", "|\n", ">\n",
      std::string("\0", 1), "\x04", "\xff", "\xef\xbb\xbf", "\t", "1e999", "-"};
  const std::string good = R"(display_name: "tiny \u00e9"
model: {num_layers: 2, d_model: 64, num_heads: 4, moe: {num_experts: 4, top_k: 2}}
data: {train_path: /data/x, seq_len: 128, packing: packed}
training: {max_steps: 10, micro_batch_rows: 2}
labels: {team: research}
)";
  std::mt19937 rng(20240611);
  for (int i = 0; i < 6000; ++i) {
    std::string text;
    if (i % 3 == 0) {
      for (int k = rng() % 40; k > 0; --k) text.push_back(static_cast<char>(rng() % 256));
    } else if (i % 3 == 1) {
      for (int k = rng() % 40; k > 0; --k) text += pieces[rng() % pieces.size()];
    } else {
      text = good;
      for (int k = 1 + rng() % 4; k > 0; --k) {
        const size_t at = rng() % text.size();
        switch (rng() % 3) {
          case 0:
            text[at] = static_cast<char>(rng() % 256);
            break;
          case 1:
            text.insert(at, pieces[rng() % pieces.size()]);
            break;
          default:
            text.erase(at, 1 + rng() % 8);
        }
        if (text.empty()) text = good;
      }
    }
    auto spec = ParseJobSpecYaml(text);
    if (!spec.ok()) {
      EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
          << EscapeUnprintable(text);
      EXPECT_FALSE(spec.status().message().empty()) << EscapeUnprintable(text);
      continue;
    }
    tally::v1::JobSpec prepared = *spec;
    const absl::Status status = PrepareJobSpec(&prepared);
    if (!status.ok()) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(UnprintableReason(status.message()), std::nullopt);
    } else {
      // Accepted means it can be sent.
      tally::v1::JobSpec received;
      EXPECT_TRUE(received.ParseFromString(prepared.SerializeAsString()))
          << EscapeUnprintable(text);
    }
  }
}

}  // namespace
}  // namespace tally
