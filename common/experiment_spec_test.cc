#include "common/experiment_spec.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec_validation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using tally::v1::ExperimentSpec;
using tally::v1::JobSpec;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kBase[] = R"(base:
  display_name: tiny
  model: {num_layers: 2, d_model: 64, num_heads: 4}
  data: {train_path: /data/corpus, seq_len: 128}
  training: {max_steps: 100, checkpoint_interval_steps: 50}
  optimizer: {lr: 0.001}
  labels: {team: nlp, owner: ana}
)";

constexpr char kExample[] = R"(display_name: recipe-ab
base:
  display_name: tiny
  model: {num_layers: 2, d_model: 64, num_heads: 4}
  data: {train_path: /data/corpus, seq_len: 128}
  training: {max_steps: 100}
variants:
  - name: naive
    overrides: {data: {packing: pad_to_seq_len}}
  - name: packed
    overrides: {}
  - name: packed-moe
    overrides: {model: {moe: {num_experts: 8, top_k: 2}}}
target: {from_variant: naive}
budget: {max_dollars: 5.0}
strategy: all
)";

ExperimentSpec ParseOrDie(const std::string& text) {
  absl::StatusOr<ExperimentSpec> spec = ParseExperimentYaml(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ExperimentSpec();
}

// An experiment on kBase with one variant of these overrides.
ExperimentSpec WithOverrides(const std::string& overrides) {
  return ParseOrDie(
      absl::StrCat(kBase, "variants:\n  - name: v\n    overrides: ", overrides,
                   "\ntarget: {val_loss: 2.5}\n"));
}

TEST(ExperimentSpecTest, ExampleParsesAndResolves) {
  const ExperimentSpec spec = ParseOrDie(kExample);
  EXPECT_EQ(spec.display_name(), "recipe-ab");
  ASSERT_EQ(spec.variants_size(), 3);
  EXPECT_EQ(spec.variants(2).name(), "packed-moe");
  EXPECT_EQ(spec.target().from_variant(), "naive");
  EXPECT_EQ(spec.budget().max_dollars(), 5.0);
  EXPECT_EQ(spec.strategy(), tally::v1::EXPERIMENT_STRATEGY_ALL);
  EXPECT_TRUE(ValidateExperimentSpec(spec).ok())
      << ValidateExperimentSpec(spec);

  absl::StatusOr<JobSpec> naive = ResolveVariant(spec, 0);
  ASSERT_TRUE(naive.ok()) << naive.status();
  EXPECT_EQ(naive->data().packing(), tally::v1::PACKING_MODE_PAD_TO_SEQ_LEN);
  EXPECT_EQ(naive->data().train_path(), "/data/corpus");
  EXPECT_EQ(naive->model().moe().num_experts(), 0);

  absl::StatusOr<JobSpec> packed = ResolveVariant(spec, 1);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->SerializeAsString(), spec.base().SerializeAsString());

  absl::StatusOr<JobSpec> moe = ResolveVariant(spec, 2);
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->model().moe().num_experts(), 8);
  EXPECT_EQ(moe->model().moe().top_k(), 2);
  EXPECT_EQ(moe->model().num_layers(), 2);
  EXPECT_EQ(moe->data().packing(), tally::v1::PACKING_MODE_UNSPECIFIED);

  EXPECT_FALSE(ResolveVariant(spec, 3).ok());
  EXPECT_FALSE(ResolveVariant(spec, -1).ok());
}

TEST(ExperimentSpecTest, ShortAndFullEnumNamesAndValLossTarget) {
  const ExperimentSpec spec = ParseOrDie(absl::StrCat(
      kBase,
      "variants: [{name: a, overrides: {}}]\ntarget: {val_loss: 2.5}\n"
      "strategy: EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING\n"));
  EXPECT_EQ(spec.strategy(), tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  EXPECT_EQ(spec.target().val_loss(), 2.5);
  EXPECT_TRUE(ValidateExperimentSpec(spec).ok())
      << ValidateExperimentSpec(spec);
  EXPECT_EQ(ParseOrDie("strategy: successive_halving").strategy(),
            tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);

  ExperimentSpec unspecified = spec;
  unspecified.clear_strategy();
  EXPECT_TRUE(ValidateExperimentSpec(unspecified).ok());
  ApplyExperimentDefaults(&unspecified);
  EXPECT_EQ(unspecified.strategy(), tally::v1::EXPERIMENT_STRATEGY_ALL);
}

// target.metric quantized_val_loss: every variant's early stopping judges
// the quantized loss (so its target stop is of the loss the target is),
// which needs a quantized evaluation in every variant.
TEST(ExperimentSpecTest, AQuantizedTargetJudgesEveryVariantByItsQuantizedLoss) {
  const std::string variants =
      "variants:\n"
      "  - name: ptq\n    overrides: {training: {eval_quantized: q4_0}}\n"
      "  - name: qat\n    overrides: {training: {qat: {format: q4_0}}}\n";
  const ExperimentSpec spec = ParseOrDie(absl::StrCat(
      kBase, variants, "target: {val_loss: 2.5, metric: quantized_val_loss}\n"));
  EXPECT_EQ(spec.target().metric(), "quantized_val_loss");
  EXPECT_TRUE(ValidateExperimentSpec(spec).ok()) << ValidateExperimentSpec(spec);
  for (int i : {0, 1}) {
    absl::StatusOr<JobSpec> v = ResolveVariant(spec, i);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->early_stopping().metric(), "quantized_val_loss");
  }

  // A variant that measures no quantized loss: named, with the fix.
  const ExperimentSpec plain = ParseOrDie(absl::StrCat(
      kBase, variants, "  - name: plain\n    overrides: {}\n",
      "target: {from_variant: qat, metric: quantized_val_loss}\n"));
  EXPECT_THAT(std::string(ValidateExperimentSpec(plain).message()),
              HasSubstr("variants[2] (plain): spec.training: target.metric quantized_val_loss "
                        "needs a quantized evaluation in every variant: set training.qat"));
  EXPECT_THAT(std::string(ValidateExperimentSpec(plain).message()),
              Not(HasSubstr("variants[0]")));
  EXPECT_FALSE(ResolveVariant(plain, 2).ok());

  // A variant whose early stopping names another metric.
  const ExperimentSpec other = ParseOrDie(absl::StrCat(
      kBase,
      "variants:\n  - name: v\n    overrides: {training: {eval_quantized: q8_0}, "
      "early_stopping: {metric: val_loss}}\n",
      "target: {val_loss: 2.5, metric: quantized_val_loss}\n"));
  EXPECT_THAT(std::string(ValidateExperimentSpec(other).message()),
              HasSubstr("variants[0] (v): spec.early_stopping.metric: is \"val_loss\" but the "
                        "experiment's target.metric is quantized_val_loss"));
  const ExperimentSpec backwards = ParseOrDie(absl::StrCat(
      kBase,
      "variants:\n  - name: v\n    overrides: {training: {eval_quantized: q8_0}, "
      "early_stopping: {metric: quantized_val_loss}}\n",
      "target: {val_loss: 2.5}\n"));
  EXPECT_THAT(std::string(ValidateExperimentSpec(backwards).message()),
              HasSubstr("target.metric is val_loss: a variant stops at the target by the loss "
                        "the target is of"));

  // The default target judges val_loss and leaves the variants' metric be.
  const ExperimentSpec by_val =
      ParseOrDie(absl::StrCat(kBase, variants, "target: {val_loss: 2.5}\n"));
  EXPECT_TRUE(ValidateExperimentSpec(by_val).ok()) << ValidateExperimentSpec(by_val);
  EXPECT_EQ(ResolveVariant(by_val, 0)->early_stopping().metric(), "");

  ExperimentSpec unknown = spec;
  unknown.mutable_target()->set_metric("bits_per_byte");
  EXPECT_THAT(std::string(ValidateExperimentSpec(unknown).message()),
              HasSubstr("target.metric: must be val_loss (the default) or quantized_val_loss, "
                        "got \"bits_per_byte\""));
}

struct MergeCase {
  std::string name;
  std::string overrides;
  std::string expected;  // kBase's spec with these fields set, as YAML
};

void PrintTo(const MergeCase& c, std::ostream* os) { *os << c.name; }

class MergeTest : public ::testing::TestWithParam<MergeCase> {};

TEST_P(MergeTest, ResolvesToTheExpectedSpec) {
  const ExperimentSpec spec = WithOverrides(GetParam().overrides);
  absl::StatusOr<JobSpec> resolved = ResolveVariant(spec, 0);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  JobSpec expected = spec.base();
  if (!GetParam().expected.empty()) {
    absl::StatusOr<ExperimentSpec> patch =
        ParseExperimentYaml(absl::StrCat("base: ", GetParam().expected));
    ASSERT_TRUE(patch.ok()) << patch.status();
    expected = patch->base();
  }
  EXPECT_EQ(resolved->DebugString(), expected.DebugString());
}

// Each `expected` is kBase's spec written out with the override applied.
INSTANTIATE_TEST_SUITE_P(
    Rules, MergeTest,
    ::testing::Values(
        MergeCase{"EmptyChangesNothing", "{}", ""},
        MergeCase{"MessageMergesKeepingSiblings", "{model: {num_layers: 4}}",
                  "{display_name: tiny, model: {num_layers: 4, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 100, checkpoint_interval_steps: "
                  "50}, optimizer: {lr: 0.001}, labels: {team: nlp, owner: "
                  "ana}}"},
        MergeCase{"ScalarReplaces",
                  "{display_name: other, optimizer: {lr: 1e-4}}",
                  "{display_name: other, model: {num_layers: 2, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 100, checkpoint_interval_steps: "
                  "50}, optimizer: {lr: 0.0001}, labels: {team: nlp, owner: "
                  "ana}}"},
        MergeCase{"ZeroValueReplaces",
                  "{training: {checkpoint_interval_steps: 0}}",
                  "{display_name: tiny, model: {num_layers: 2, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 100}, optimizer: {lr: 0.001}, "
                  "labels: {team: nlp, owner: ana}}"},
        MergeCase{"NullClears", "{optimizer: {lr: }, display_name: null}",
                  "{model: {num_layers: 2, d_model: 64, num_heads: 4}, data: "
                  "{train_path: /data/corpus, seq_len: 128}, training: "
                  "{max_steps: 100, checkpoint_interval_steps: 50}, optimizer: "
                  "{}, labels: {team: nlp, owner: ana}}"},
        MergeCase{"LabelsMergeByKey", "{labels: {team: vision, run: \"007\"}}",
                  "{display_name: tiny, model: {num_layers: 2, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 100, checkpoint_interval_steps: "
                  "50}, optimizer: {lr: 0.001}, labels: {team: vision, owner: "
                  "ana, run: \"007\"}}"},
        MergeCase{"TextKeptAsWritten", "{labels: {run: 007}, display_name: 12}",
                  "{display_name: \"12\", model: {num_layers: 2, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 100, checkpoint_interval_steps: "
                  "50}, optimizer: {lr: 0.001}, labels: {team: nlp, owner: "
                  "ana, run: \"007\"}}"},
        MergeCase{"JsonNamesAndQuotedNumbers",
                  "{training: {maxSteps: \"200\"}}",
                  "{display_name: tiny, model: {num_layers: 2, d_model: 64, "
                  "num_heads: 4}, data: {train_path: /data/corpus, seq_len: "
                  "128}, training: {max_steps: 200, checkpoint_interval_steps: "
                  "50}, optimizer: {lr: 0.001}, labels: {team: nlp, owner: "
                  "ana}}"}),
    [](const auto& info) { return info.param.name; });

// JobSpec has no list fields, so the list rule is shown on ExperimentSpec.
TEST(MergeOverridesTest, ListReplaces) {
  ExperimentSpec base = ParseOrDie(
      "variants: [{name: a, overrides: {x: 1}}, {name: b}]\n"
      "target: {val_loss: 3}\n");
  const ExperimentSpec holder = ParseOrDie(
      "variants: [{name: h, overrides: {variants: [{name: c}], target: "
      "{from_variant: c}}}]");
  ASSERT_TRUE(MergeOverrides(holder.variants(0).overrides(), &base, "").ok());
  ASSERT_EQ(base.variants_size(), 1);
  EXPECT_EQ(base.variants(0).name(), "c");
  EXPECT_FALSE(base.variants(0).has_overrides());
  EXPECT_EQ(base.target().from_variant(), "c");  // the oneof switches
}

TEST(MergeOverridesTest, ErrorLeavesBaseUnchanged) {
  ExperimentSpec base = ParseOrDie("display_name: x\ntarget: {val_loss: 3}\n");
  const std::string before = base.SerializeAsString();
  const ExperimentSpec holder = ParseOrDie(
      "variants: [{name: h, overrides: {display_name: y, strategy: bogus}}]");
  absl::Status s = MergeOverrides(holder.variants(0).overrides(), &base, "");
  EXPECT_THAT(s.message(), HasSubstr("strategy: unknown value \"bogus\""));
  EXPECT_EQ(base.SerializeAsString(), before);
}

struct BadCase {
  std::string name;
  std::string text;     // a whole experiment file
  std::string message;  // parsing or validation must say this
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadExperimentTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadExperimentTest, IsRefusedNamingTheProblem) {
  absl::StatusOr<ExperimentSpec> spec = ParseExperimentYaml(GetParam().text);
  absl::Status status =
      spec.ok() ? ValidateExperimentSpec(*spec) : spec.status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(GetParam().message));
}

std::string Exp(const std::string& variants, const std::string& rest) {
  return absl::StrCat(kBase, "variants:\n", variants, rest);
}

INSTANTIATE_TEST_SUITE_P(
    Errors, BadExperimentTest,
    ::testing::Values(
        BadCase{
            "VariantFieldIsNamed",
            Exp("  - {name: a, overrides: {}}\n  - {name: b}\n"
                "  - name: packed-moe\n"
                "    overrides: {model: {moe: {num_experts: 8, top_k: 9}}}\n",
                "target: {from_variant: a}\n"),
            "variants[2] (packed-moe): spec.model.moe.top_k: must be "
            "between 1 and 8, got 9"},
        BadCase{"UnknownOverrideField",
                Exp("  - {name: a, overrides: {model: {num_layerz: 3}}}\n",
                    "target: {val_loss: 2}\n"),
                "variants[0] (a): spec.model.num_layerz: unknown field"},
        BadCase{"OverrideWrongType",
                Exp("  - {name: a, overrides: {model: {num_layers: [1]}}}\n",
                    "target: {val_loss: 2}\n"),
                "variants[0] (a): spec.model.num_layers: expected a single "
                "value, got a list"},
        BadCase{"OverrideBadEnum",
                Exp("  - {name: a, overrides: {data: {packing: tight}}}\n",
                    "target: {val_loss: 2}\n"),
                "variants[0] (a): spec.data.packing: unknown value \"tight\""},
        BadCase{
            "DuplicateNames",
            Exp("  - {name: a}\n  - {name: a}\n", "target: {val_loss: 2}\n"),
            "variants[1].name: \"a\" is also the name of variants[0]"},
        BadCase{"BadName", Exp("  - {name: A/b}\n", "target: {val_loss: 2}\n"),
                "variants[0].name: \"A/b\" must be 1 to 64 characters"},
        BadCase{"NoVariants", absl::StrCat(kBase, "target: {val_loss: 2}\n"),
                "variants: at least one variant is needed"},
        BadCase{"UnknownFromVariant",
                Exp("  - {name: a}\n  - {name: b}\n",
                    "target: {from_variant: c}\n"),
                "target.from_variant: \"c\" is not a variant; the variants "
                "are: a, b"},
        BadCase{"NoTarget", Exp("  - {name: a}\n", ""), "target: is not set"},
        BadCase{
            "BothTargets",
            Exp("  - {name: a}\n", "target: {from_variant: a, val_loss: 2}\n"),
            "target.val_loss (lines 10 and 10): \"from_variant\" and "
            "\"val_loss\" are alternatives; keep one"},
        BadCase{"NegativeValLoss",
                Exp("  - {name: a}\n", "target: {val_loss: -1}\n"),
                "target.val_loss: must be a positive finite number"},
        BadCase{"TooManyReplicates",
                Exp("  - {name: a}\n", "target: {val_loss: 1}\nreplicates: 1000000\n"),
                "replicates: must be 1 to 8 (0: 1), got 1000000"},
        BadCase{"NegativeReplicates",
                Exp("  - {name: a}\n", "target: {val_loss: 1}\nreplicates: -2\n"),
                "replicates: must be 1 to 8"},
        BadCase{"NegativeBudget",
                Exp("  - {name: a}\n",
                    "target: {val_loss: 1}\nbudget: {max_dollars: -5}\n"),
                "budget.max_dollars: must be a finite number >= 0"},
        BadCase{
            "UnknownStrategy",
            Exp("  - {name: a}\n", "target: {val_loss: 1}\nstrategy: best\n"),
            "strategy (line 11): unknown value \"best\"; allowed: all, "
            "successive_halving"},
        BadCase{"BaseIsReadStrictly", "base:\n  model: {num_layers: two}\n",
                "base.model.num_layers (line 2): expected an integer"},
        BadCase{"BaseIsValidated",
                "base: {model: {num_layers: 0}}\nvariants: [{name: a}]\n"
                "target: {val_loss: 1}\n",
                "variants[0] (a): spec.model.num_layers"},
        BadCase{"Alias",
                "base: &b {display_name: x}\nvariants: [{name: a, overrides: "
                "*b}]\n",
                "line 1: anchors (&name) and aliases (*name) are not allowed"},
        BadCase{"DuplicateKey", "display_name: a\ndisplay_name: b\n",
                "display_name (lines 1 and 2): given twice"},
        BadCase{"DuplicateKeyInOverrides",
                Exp("  - name: a\n    overrides: {labels: {x: 1, x: 2}}\n",
                    "target: {val_loss: 1}\n"),
                "variants[0].overrides.labels.x (lines 10 and 10): given "
                "twice"},
        BadCase{"UnknownTopLevelKey", "display_name: a\nvariant: []\n",
                "variant (line 2): unknown field; ExperimentSpec has: "
                "display_name, base, variants"},
        BadCase{
            "OverridesNotAMapping",
            Exp("  - {name: a, overrides: [1]}\n", "target: {val_loss: 1}\n"),
            "variants[0].overrides (line 9): expected a mapping, got a "
            "list"},
        BadCase{"TwoDocuments", "display_name: a\n---\ndisplay_name: b\n",
                "line 2: a second YAML document"},
        BadCase{"UnprintableDisplayName",
                Exp("  - {name: a}\n",
                    "target: {val_loss: 1}\n"
                    "display_name: \"a\\u202eb\"\n"),
                "display_name: contains control character U+202E"}),
    [](const auto& info) { return info.param.name; });

TEST(ExperimentSpecTest, EveryProblemIsListed) {
  const ExperimentSpec spec = ParseOrDie(
      Exp("  - {name: a, overrides: {model: {num_heads: 0}}}\n"
          "  - {name: b, overrides: {model: {moe: {num_experts: 2, top_k: 3}}, "
          "data: {seq_len: 0}}}\n",
          "target: {from_variant: z}\n"));
  const std::string message(ValidateExperimentSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("target.from_variant"));
  EXPECT_THAT(message, HasSubstr("variants[0] (a): spec.model.num_heads"));
  EXPECT_THAT(message, HasSubstr("variants[1] (b): spec.model.moe.top_k"));
  EXPECT_THAT(message, HasSubstr("variants[1] (b): spec.data.seq_len"));
}

TEST(ExperimentSpecTest, TooManyVariants) {
  std::string variants;
  for (int i = 0; i < kMaxExperimentVariants + 1; ++i) {
    absl::StrAppend(&variants, "  - {name: v", i, "}\n");
  }
  const ExperimentSpec spec =
      ParseOrDie(Exp(variants, "target: {val_loss: 1}\n"));
  EXPECT_THAT(ValidateExperimentSpec(spec).message(),
              HasSubstr("variants: at most 32 variants, got 33"));
}

TEST(ExperimentSpecTest, SourceNamesTheFile) {
  absl::StatusOr<ExperimentSpec> spec =
      ParseExperimentYaml("base: {model: {num_layers: x}}", "exp.yaml");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("exp.yaml: base.model.num_layers (line 1)"));
}

TEST(ExperimentSpecTest, HostileNameIsEscapedInMessages) {
  ExperimentSpec spec =
      ParseOrDie(Exp("  - {name: a}\n", "target: {val_loss: 1}\n"));
  spec.mutable_variants(0)->set_name("x\x1b[31m");
  spec.mutable_base()->mutable_model()->set_num_layers(0);
  const std::string message(ValidateExperimentSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("variants[0] (\"x\\x1b[31m\"): spec.model"));
  EXPECT_THAT(message, Not(HasSubstr("\x1b")));
}

TEST(ExperimentSpecTest, OverridesKeepTheTextOfEachValue) {
  const ExperimentSpec spec = ParseOrDie(
      "variants: [{name: a, overrides: {n: 8, q: \"8\", e: 1e-4, z: 007, "
      "h: 2.5, b: true, y: yes, t: !!str 9, nothing: , l: [1, x]}}]");
  const auto& f = spec.variants(0).overrides().fields();
  EXPECT_EQ(f.at("n").number_value(), 8);
  EXPECT_EQ(f.at("q").string_value(), "8");
  EXPECT_EQ(f.at("e").string_value(), "1e-4");
  EXPECT_EQ(f.at("z").string_value(), "007");
  EXPECT_EQ(f.at("h").number_value(), 2.5);
  EXPECT_TRUE(f.at("b").bool_value());
  EXPECT_EQ(f.at("y").string_value(), "yes");
  EXPECT_EQ(f.at("t").string_value(), "9");
  EXPECT_EQ(f.at("nothing").kind_case(), google::protobuf::Value::kNullValue);
  ASSERT_EQ(f.at("l").list_value().values_size(), 2);
  EXPECT_EQ(f.at("l").list_value().values(1).string_value(), "x");
}

TEST(MergeOverridesTest, BuiltStructsAreCheckedAndBounded) {
  google::protobuf::Struct overrides;
  google::protobuf::Struct* s = &overrides;
  for (int i = 0; i < 100; ++i) {
    s = (*s->mutable_fields())["model"].mutable_struct_value();
  }
  JobSpec spec;
  EXPECT_THAT(std::string(MergeOverrides(overrides, &spec).message()),
              HasSubstr("nested more than"));

  google::protobuf::Struct fractional;
  (*(*fractional.mutable_fields())["model"]
        .mutable_struct_value()
        ->mutable_fields())["num_layers"]
      .set_number_value(2.5);
  EXPECT_THAT(
      std::string(MergeOverrides(fractional, &spec).message()),
      HasSubstr("spec.model.num_layers: expected an integer, got \"2.5\""));

  google::protobuf::Struct good;
  (*(*good.mutable_fields())["optimizer"]
        .mutable_struct_value()
        ->mutable_fields())["lr"]
      .set_number_value(0.0003);
  ASSERT_TRUE(MergeOverrides(good, &spec).ok());
  EXPECT_EQ(spec.optimizer().lr(), 0.0003);
}

TEST(MergeOverridesTest, TwoTargetsInABuiltStructAreRefused) {
  google::protobuf::Struct overrides;
  auto* target = (*overrides.mutable_fields())["target"]
                     .mutable_struct_value()
                     ->mutable_fields();
  (*target)["from_variant"].set_string_value("a");
  (*target)["val_loss"].set_number_value(2);
  ExperimentSpec spec;
  EXPECT_EQ(std::string(MergeOverrides(overrides, &spec, "").message()),
            "target.val_loss: \"from_variant\" and \"val_loss\" are "
            "alternatives; keep one");
}

}  // namespace
}  // namespace tally
