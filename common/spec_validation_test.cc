#include "common/spec_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/spec_yaml.h"
#include "common/text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;
using tally::v1::JobSpec;

JobSpec GoodSpec() {
  JobSpec spec;
  spec.mutable_model()->set_num_layers(2);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_num_heads(4);
  spec.mutable_data()->set_train_path("/data/corpus");
  spec.mutable_data()->set_seq_len(128);
  spec.mutable_training()->set_max_steps(100);
  ApplySpecDefaults(&spec);
  return spec;
}

TEST(SpecValidationTest, AllowedWorldSizesDivideTheMicroBatchesAndExperts) {
  JobSpec spec = GoodSpec();
  spec.mutable_resources()->set_gpu_count(4);
  // 8 micro-batches of 128 x 8 tokens a step: 4, 2 and 1 ranks share them.
  spec.mutable_training()->set_global_batch_tokens(8 * 128 * 8);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(AllowedWorldSizes(spec), (std::vector<int>{4, 2, 1}));
  spec.mutable_training()->set_global_batch_tokens(12 * 128 * 8);  // 12: 4, 3, 2, 1
  EXPECT_EQ(AllowedWorldSizes(spec), (std::vector<int>{4, 3, 2, 1}));
  auto* moe = spec.mutable_model()->mutable_moe();
  moe->set_num_experts(4);
  moe->set_top_k(1);
  moe->set_expert_parallel(true);  // 3 ranks cannot split 4 experts
  EXPECT_EQ(AllowedWorldSizes(spec), (std::vector<int>{4, 2, 1}));
  spec.mutable_resources()->set_gpu_count(1);
  EXPECT_EQ(AllowedWorldSizes(spec), (std::vector<int>{1}));
}

TEST(SpecValidationTest, GoodSpecIsValidAfterDefaults) {
  JobSpec spec = GoodSpec();
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(spec.resources().gpu_type(), "cpu");
  EXPECT_EQ(spec.resources().gpu_count(), 1);
  EXPECT_EQ(spec.max_attempts(), 3);
  EXPECT_EQ(spec.resources().capacity(), "any");
  EXPECT_EQ(spec.max_preemptions(), 0);  // unlimited
  EXPECT_EQ(spec.training().global_batch_tokens(), 128 * 8);
  EXPECT_EQ(spec.data().packing(), tally::v1::PACKING_MODE_PACKED);
}

TEST(SpecValidationTest, DefaultsAreIdempotent) {
  JobSpec once = GoodSpec();
  JobSpec twice = once;
  ApplySpecDefaults(&twice);
  EXPECT_EQ(once.SerializeAsString(), twice.SerializeAsString());
}

struct BadCase {
  std::string name;
  std::function<void(JobSpec*)> mutate;
  std::string field;  // the message must name it
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }


class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, NamesTheField) {
  JobSpec spec = GoodSpec();
  GetParam().mutate(&spec);
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("spec." + GetParam().field + ":"));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadSpecTest,
    ::testing::Values(
        BadCase{"no_layers", [](JobSpec* s) { s->mutable_model()->set_num_layers(0); },
                "model.num_layers"},
        BadCase{"heads_do_not_divide",
                [](JobSpec* s) { s->mutable_model()->set_num_heads(5); },
                "model.num_heads"},
        BadCase{"odd_head_dim",
                [](JobSpec* s) {
                  s->mutable_model()->set_d_model(60);
                  s->mutable_model()->set_num_heads(4);
                },
                "model.num_heads"},
        BadCase{"top_k_over_experts",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(5);
                  s->mutable_model()->mutable_moe()->set_router("softmax");
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                },
                "model.moe.top_k"},
        BadCase{"moe_options_without_experts",
                [](JobSpec* s) { s->mutable_model()->mutable_moe()->set_top_k(2); },
                "model.moe.num_experts"},
        BadCase{"bad_router",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(1);
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                  s->mutable_model()->mutable_moe()->set_router("argmax");
                },
                "model.moe.router"},
        BadCase{"fp8_recipe_without_fp8",
                [](JobSpec* s) {
                  s->mutable_precision()->set_fp8_recipe(
                      tally::v1::FP8_RECIPE_CURRENT);
                },
                "precision.fp8_recipe"},
        BadCase{"upcycle_without_source",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(2);
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                  s->mutable_model()->mutable_moe()->set_router("softmax");
                  s->mutable_model()->mutable_init_from()->mutable_upcycle();
                },
                "model.init_from.upcycle"},
        BadCase{"upcycle_dense_target",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_init_from()->set_checkpoint("d.ckpt");
                  s->mutable_model()->mutable_init_from()->mutable_upcycle();
                },
                "model.moe.num_experts"},
        BadCase{"upcycle_top_1",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(1);
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                  s->mutable_model()->mutable_moe()->set_router("softmax");
                  s->mutable_model()->mutable_init_from()->set_checkpoint("d.ckpt");
                  s->mutable_model()->mutable_init_from()->mutable_upcycle();
                },
                "model.moe.top_k"},
        BadCase{"upcycle_shared_expert",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(2);
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                  s->mutable_model()->mutable_moe()->set_router("softmax");
                  s->mutable_model()->mutable_moe()->set_shared_expert(true);
                  s->mutable_model()->mutable_init_from()->set_checkpoint("d.ckpt");
                  s->mutable_model()->mutable_init_from()->mutable_upcycle();
                },
                "model.moe.shared_expert"},
        BadCase{"upcycle_noise_nan",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_top_k(2);
                  s->mutable_model()->mutable_moe()->set_every_n_layers(1);
                  s->mutable_model()->mutable_moe()->set_router("softmax");
                  s->mutable_model()->mutable_init_from()->set_checkpoint("d.ckpt");
                  s->mutable_model()->mutable_init_from()->mutable_upcycle()->set_noise_std(
                      std::nan(""));
                },
                "model.init_from.upcycle.noise_std"},
        BadCase{"distill_without_teacher",
                [](JobSpec* s) { s->mutable_training()->mutable_distill()->set_alpha(0.5); },
                "training.distill.teacher"},
        BadCase{"distill_two_teachers",
                [](JobSpec* s) {
                  auto* t = s->mutable_training()->mutable_distill()->mutable_teacher();
                  t->set_hf("dir");
                  t->set_checkpoint("t.ckpt");
                },
                "training.distill.teacher"},
        BadCase{"distill_alpha_above_1",
                [](JobSpec* s) {
                  auto* d = s->mutable_training()->mutable_distill();
                  d->mutable_teacher()->set_checkpoint("t.ckpt");
                  d->set_alpha(1.5);
                },
                "training.distill.alpha"},
        BadCase{"distill_negative_temperature",
                [](JobSpec* s) {
                  auto* d = s->mutable_training()->mutable_distill();
                  d->mutable_teacher()->set_checkpoint("t.ckpt");
                  d->set_temperature(-1);
                },
                "training.distill.temperature"},
        BadCase{"distill_teacher_path_nul",
                [](JobSpec* s) {
                  s->mutable_training()->mutable_distill()->mutable_teacher()->set_hf(
                      std::string("a\0b", 3));
                },
                "training.distill.teacher.hf"},
        BadCase{"distill_teacher_model_heads",
                [](JobSpec* s) {
                  auto* t = s->mutable_training()->mutable_distill()->mutable_teacher();
                  t->set_checkpoint("t.ckpt");
                  t->mutable_model()->set_num_layers(2);
                  t->mutable_model()->set_d_model(64);
                  t->mutable_model()->set_num_heads(0);
                },
                "training.distill.teacher.model.num_heads"},
        BadCase{"init_from_both",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_init_from()->set_hf("hf");
                  s->mutable_model()->mutable_init_from()->set_checkpoint("a.ckpt");
                },
                "model.init_from"},
        BadCase{"init_from_long_path",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_init_from()->set_hf(std::string(5000, 'a'));
                },
                "model.init_from.hf"},
        BadCase{"no_train_path",
                [](JobSpec* s) { s->mutable_data()->clear_train_path(); },
                "data.train_path"},
        BadCase{"tiny_seq_len",
                [](JobSpec* s) { s->mutable_data()->set_seq_len(4); },
                "data.seq_len"},
        BadCase{"nan_lr",
                [](JobSpec* s) { s->mutable_optimizer()->set_lr(std::nan("")); },
                "optimizer.lr"},
        BadCase{"min_lr_over_lr",
                [](JobSpec* s) { s->mutable_optimizer()->set_min_lr(1.0); },
                "optimizer.min_lr"},
        BadCase{"beta_one",
                [](JobSpec* s) { s->mutable_optimizer()->set_beta2(1.0); },
                "optimizer.beta2"},
        BadCase{"no_steps",
                [](JobSpec* s) { s->mutable_training()->set_max_steps(0); },
                "training.max_steps"},
        BadCase{"warmup_past_end",
                [](JobSpec* s) { s->mutable_optimizer()->set_warmup_steps(500); },
                "optimizer.warmup_steps"},
        BadCase{"batch_not_multiple",
                [](JobSpec* s) {
                  s->mutable_training()->set_global_batch_tokens(1000);
                },
                "training.global_batch_tokens"},
        BadCase{"batch_not_split_by_gpus",
                [](JobSpec* s) {
                  s->mutable_resources()->set_gpu_count(3);
                  s->mutable_training()->set_global_batch_tokens(128 * 8 * 4);
                },
                "training.global_batch_tokens"},
        BadCase{"experts_not_split_by_gpus",
                [](JobSpec* s) {
                  s->mutable_resources()->set_gpu_count(4);
                  s->mutable_training()->set_global_batch_tokens(128 * 8 * 4);
                  s->mutable_model()->mutable_moe()->set_num_experts(6);
                  s->mutable_model()->mutable_moe()->set_top_k(2);
                  s->mutable_model()->mutable_moe()->set_expert_parallel(true);
                },
                "model.moe.expert_parallel"},
        BadCase{"negative_budget",
                [](JobSpec* s) { s->mutable_budget()->set_max_dollars(-1); },
                "budget.max_dollars"},
        BadCase{"gpu_type_upper",
                [](JobSpec* s) { s->mutable_resources()->set_gpu_type("H200"); },
                "resources.gpu_type"},
        BadCase{"too_many_gpus",
                [](JobSpec* s) { s->mutable_resources()->set_gpu_count(5000); },
                "resources.gpu_count"},
        BadCase{"priority", [](JobSpec* s) { s->set_priority(5000); }, "priority"},
        BadCase{"attempts", [](JobSpec* s) { s->set_max_attempts(1000); },
                "max_attempts"},
        BadCase{"capacity",
                [](JobSpec* s) { s->mutable_resources()->set_capacity("preemptible"); },
                "resources.capacity"},
        BadCase{"negative_preemptions", [](JobSpec* s) { s->set_max_preemptions(-1); },
                "max_preemptions"},
        BadCase{"divergence_below_one",
                [](JobSpec* s) {
                  s->mutable_early_stopping()->set_divergence_factor(0.5);
                },
                "early_stopping.divergence_factor"},
        BadCase{"negative_target",
                [](JobSpec* s) { s->mutable_early_stopping()->set_target_val_loss(-1); },
                "early_stopping.target_val_loss"},
        BadCase{"nan_target",
                [](JobSpec* s) {
                  s->mutable_early_stopping()->set_target_val_loss(std::nan(""));
                },
                "early_stopping.target_val_loss"},
        BadCase{"relative_target_above_the_baseline",
                [](JobSpec* s) { s->mutable_early_stopping()->set_target_rel_to_baseline(1.5); },
                "early_stopping.target_rel_to_baseline"},
        BadCase{"both_targets",
                [](JobSpec* s) {
                  s->mutable_early_stopping()->set_target_val_loss(2.0);
                  s->mutable_early_stopping()->set_target_rel_to_baseline(0.8);
                },
                "early_stopping.target_rel_to_baseline"},
        BadCase{"forecast_from_one_eval",
                [](JobSpec* s) {
                  s->mutable_early_stopping()->set_forecast(true);
                  s->mutable_early_stopping()->set_forecast_min_evals(1);
                },
                "early_stopping.forecast_min_evals"},
        BadCase{"label_key",
                [](JobSpec* s) { (*s->mutable_labels())["Team"] = "x"; },
                "labels[\"Team\"]"},
        BadCase{"display_name_not_utf8",
                [](JobSpec* s) { s->set_display_name("caf\xe9"); }, "display_name"},
        BadCase{"display_name_escape_sequence",
                [](JobSpec* s) { s->set_display_name("\x1b[2Jgotcha"); }, "display_name"},
        BadCase{"display_name_newline",
                [](JobSpec* s) { s->set_display_name("two\nlines"); }, "display_name"},
        BadCase{"display_name_bidi_override",
                [](JobSpec* s) { s->set_display_name("abc\xe2\x80\xae"); }, "display_name"},
        BadCase{"display_name_too_long",
                [](JobSpec* s) { s->set_display_name(std::string(201, 'x')); },
                "display_name"},
        BadCase{"train_path_nul",
                [](JobSpec* s) {
                  s->mutable_data()->set_train_path(std::string("/data/x\0/etc", 13));
                },
                "data.train_path"},
        BadCase{"train_path_too_long",
                [](JobSpec* s) { s->mutable_data()->set_train_path(std::string(5000, 'a')); },
                "data.train_path"},
        BadCase{"val_path_not_utf8",
                [](JobSpec* s) { s->mutable_data()->set_val_path("/data/\xff"); },
                "data.val_path"},
        BadCase{"label_value_control",
                [](JobSpec* s) { (*s->mutable_labels())["team"] = "a\rb"; },
                "labels[\"team\"]"},
        BadCase{"label_key_not_utf8",
                [](JobSpec* s) { (*s->mutable_labels())["t\xc3"] = "x"; },
                "labels[\"t\\xc3\"]"},
        BadCase{"router_nul_with_experts",
                [](JobSpec* s) {
                  s->mutable_model()->mutable_moe()->set_num_experts(4);
                  s->mutable_model()->mutable_moe()->set_router(std::string("softmax\0", 8));
                },
                "model.moe.router"},
        BadCase{"gpu_type_control",
                [](JobSpec* s) { s->mutable_resources()->set_gpu_type("h200\x07"); },
                "resources.gpu_type"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// The forms the README and the issue write, from YAML, with their defaults:
// upcycling takes two experts a token unless told otherwise; distillation
// alpha 0.5 and temperature 1, but an alpha of 0 stays 0.
TEST(SpecValidationTest, UpcycleAndDistillFromYamlWithDefaults) {
  auto spec = ParseJobSpecYaml(R"(
model:
  num_layers: 2
  d_model: 64
  num_heads: 4
  moe: {num_experts: 8}
  init_from: {checkpoint: dense.ckpt, upcycle: {noise_std: 0.0}}
data: {train_path: /data/corpus, seq_len: 128}
training:
  max_steps: 10
  distill: {teacher: {checkpoint: teacher.ckpt}}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model().init_from().has_upcycle());
  ApplySpecDefaults(&*spec);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  EXPECT_EQ(spec->model().moe().top_k(), 2);
  EXPECT_EQ(spec->training().distill().alpha(), 0.5);
  EXPECT_EQ(spec->training().distill().temperature(), 1.0);

  auto zero = ParseJobSpecYaml(R"(
model: {num_layers: 1, d_model: 64, num_heads: 4}
data: {train_path: /data/corpus, seq_len: 128}
training:
  max_steps: 10
  distill: {teacher: {hf: teacher-hf}, temperature: 2, alpha: 0}
)");
  ASSERT_TRUE(zero.ok()) << zero.status();
  ApplySpecDefaults(&*zero);
  EXPECT_TRUE(ValidateJobSpec(*zero).ok()) << ValidateJobSpec(*zero);
  EXPECT_EQ(zero->training().distill().alpha(), 0.0);
  EXPECT_EQ(zero->training().distill().temperature(), 2.0);

  auto typo = ParseJobSpecYaml("training: {distill: {teacher: {ckpt: t.ckpt}}}");
  EXPECT_THAT(typo.status().message(), HasSubstr("training.distill.teacher.ckpt"));
}

TEST(SpecValidationTest, QuantizationFromYamlWithDefaultsAndItsRefusals) {
  auto spec = ParseJobSpecYaml(R"(
model: {num_layers: 2, d_model: 64, num_heads: 4}
data: {train_path: /data/corpus, seq_len: 128}
training: {max_steps: 10, qat: {format: q4_0}}
early_stopping: {patience: 2, metric: quantized_val_loss}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplySpecDefaults(&*spec);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  EXPECT_EQ(spec->training().qat().layers(), "ffn");
  EXPECT_EQ(spec->training().eval_quantized(), "q4_0");
  EXPECT_EQ(spec->training().eval_quantized_layers(), "ffn");

  auto refused = [](const std::string& yaml) {
    auto s = ParseJobSpecYaml(yaml);
    EXPECT_TRUE(s.ok()) << s.status();
    ApplySpecDefaults(&*s);
    return std::string(ValidateJobSpec(*s).message());
  };
  const std::string base =
      "model: {num_layers: 2, d_model: 64, num_heads: 4}\n"
      "data: {train_path: /data/corpus, seq_len: 128}\n";
  EXPECT_THAT(refused(base + "training: {max_steps: 10, qat: {format: q4_1}}"),
              HasSubstr("spec.training.qat.format: must be q8_0 or q4_0"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10, qat: {format: q8_0, layers: attn}}"),
              HasSubstr("spec.training.qat.layers: must be ffn"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10, eval_quantized: int8}"),
              HasSubstr("spec.training.eval_quantized: must be q8_0 or q4_0"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10, eval_quantized_layers: ffn}"),
              HasSubstr("spec.training.eval_quantized_layers: is set but"));
  EXPECT_THAT(
      refused(base + "training: {max_steps: 10, qat: {format: q4_0}, eval_quantized: q8_0}"),
      HasSubstr("spec.training.eval_quantized: with training.qat"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10, qat: {format: q4_0}}\n"
                             "precision: {compute: PRECISION_FP8}"),
              HasSubstr("spec.training.qat: cannot be combined with precision.compute"));
  EXPECT_THAT(refused("model: {num_layers: 2, d_model: 48, num_heads: 4}\n"
                      "data: {train_path: /data/corpus, seq_len: 128}\n"
                      "training: {max_steps: 10, eval_quantized: q8_0}"),
              HasSubstr("model.d_model must be a multiple of 32, got 48"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10}\n"
                             "early_stopping: {metric: quantized_val_loss}"),
              HasSubstr("spec.early_stopping.metric: quantized_val_loss needs a quantized"));
  EXPECT_THAT(refused(base + "training: {max_steps: 10}\nearly_stopping: {metric: loss}"),
              HasSubstr("spec.early_stopping.metric: must be val_loss"));
}

TEST(SpecValidationTest, DisplayNameCountsCharactersNotBytes) {
  JobSpec spec = GoodSpec();
  std::string name;
  for (int i = 0; i < 200; ++i) name += "\xe6\x97\xa5";  // 200 characters, 600 bytes
  spec.set_display_name(name);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.set_display_name(name + "x");
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("spec.display_name: must be at most 200 characters, got 201"));
}

TEST(SpecValidationTest, UnprintableStringsAreNamedAndEscaped) {
  JobSpec spec = GoodSpec();
  spec.set_display_name("\x1b]0;owned\x07");
  spec.mutable_data()->set_train_path(std::string("/data/x\0y", 9));
  (*spec.mutable_labels())["\xff"] = "v";
  const absl::Status status = ValidateJobSpec(spec);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("spec.display_name: must be printable text, but it "
                                 "contains control character U+001B at offset 0"));
  EXPECT_THAT(message, HasSubstr("spec.data.train_path: must be printable text, but it "
                                 "contains a NUL byte at offset 7"));
  EXPECT_THAT(message, HasSubstr("spec.labels[\"\\xff\"]: keys must be printable text, but "
                                 "this one is not valid UTF-8"));
  // The message itself is safe to print and to send.
  EXPECT_EQ(UnprintableReason(message), std::nullopt) << EscapeUnprintable(message);
}

// What validation accepts, protobuf can send: tallyd would otherwise fail to
// parse the request with no word on which field is wrong.
TEST(SpecValidationTest, EveryAcceptedStringSurvivesTheWire) {
  JobSpec spec = GoodSpec();
  spec.set_display_name("caf\xc3\xa9 \xf0\x9f\x9a\x80 run");
  (*spec.mutable_labels())["team"] = "\xe6\x97\xa5\xe6\x9c\xac";
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  JobSpec received;
  ASSERT_TRUE(received.ParseFromString(spec.SerializeAsString()));
  EXPECT_EQ(received.display_name(), spec.display_name());

  spec.set_display_name("caf\xe9");
  EXPECT_FALSE(received.ParseFromString(spec.SerializeAsString()));
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("spec.display_name: must be printable text, but it is not valid "
                        "UTF-8 (byte 0xe9 at offset 3)"));
}

TEST(SpecValidationTest, MoeFieldsWithoutExpertsAreNamed) {
  JobSpec spec = GoodSpec();
  spec.mutable_model()->mutable_moe()->set_every_n_layers(-1);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("spec.model.moe.num_experts: MoE options are set "
                        "(model.moe.every_n_layers) but num_experts is 0"));
  spec = GoodSpec();
  spec.mutable_model()->mutable_moe()->set_router("sigmoid");
  spec.mutable_model()->mutable_moe()->set_z_loss_coef(0.1);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("(model.moe.z_loss_coef, model.moe.router)"));
  spec = GoodSpec();
  spec.mutable_model()->mutable_moe();  // present but empty: a dense model
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(SpecValidationTest, DefaultsDoNotOverflowOnHugeValues) {
  JobSpec spec = GoodSpec();
  spec.mutable_training()->clear_global_batch_tokens();
  spec.mutable_data()->set_seq_len(std::numeric_limits<int32_t>::max());
  spec.mutable_training()->set_micro_batch_rows(std::numeric_limits<int32_t>::max());
  spec.mutable_resources()->set_gpu_count(std::numeric_limits<int32_t>::max());
  ApplySpecDefaults(&spec);
  EXPECT_EQ(spec.training().global_batch_tokens(), 0);
  const std::string message(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("spec.data.seq_len:"));
  EXPECT_THAT(message, HasSubstr("spec.resources.gpu_count:"));
}

TEST(SpecValidationTest, LabelProblemsComeInKeyOrder) {
  JobSpec spec = GoodSpec();
  for (const char* key : {"Zeta", "Alpha", "Mid"}) (*spec.mutable_labels())[key] = "x";
  const std::string message(ValidateJobSpec(spec).message());
  const size_t alpha = message.find("labels[\"Alpha\"]");
  const size_t mid = message.find("labels[\"Mid\"]");
  const size_t zeta = message.find("labels[\"Zeta\"]");
  ASSERT_NE(zeta, std::string::npos) << message;
  EXPECT_LT(alpha, mid);
  EXPECT_LT(mid, zeta);
}

// PrepareJobSpec is the check tallyd's Submit makes; `tallyctl validate`
// reads a file with ReadJobSpecFile and makes the same call.
TEST(SpecValidationTest, PrepareAppliesDefaultsThenValidates) {
  auto spec = ParseJobSpecYaml(R"(
model: {num_layers: 2, d_model: 64, num_heads: 4}
data: {train_path: /data/corpus, seq_len: 128}
training: {max_steps: 100}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(PrepareJobSpec(&*spec).ok());
  EXPECT_EQ(spec->resources().gpu_type(), "cpu");
  EXPECT_EQ(spec->training().global_batch_tokens(), 128 * 8);

  spec = ParseJobSpecYaml(R"(
display_name: "bad \xff \x1b name"
model: {num_layers: 2, d_model: 64, num_heads: 4, moe: {every_n_layers: -1}}
data: {train_path: "/data/\0corpus", seq_len: 128}
training: {max_steps: 100}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string message(PrepareJobSpec(&*spec).message());
  EXPECT_THAT(message, HasSubstr("spec.display_name:"));
  EXPECT_THAT(message, HasSubstr("model.moe.every_n_layers"));
  EXPECT_THAT(message, HasSubstr("spec.data.train_path:"));
}

TEST(SpecValidationTest, MessagesStayShortWhateverTheSpec) {
  JobSpec spec = GoodSpec();
  spec.mutable_resources()->set_gpu_type(std::string(100000, 'X'));
  for (int i = 0; i < 60; ++i) (*spec.mutable_labels())[absl::StrCat("Bad", i)] = "x";
  const std::string message(ValidateJobSpec(spec).message());
  EXPECT_THAT(message, HasSubstr("spec.resources.gpu_type:"));
  EXPECT_THAT(message, HasSubstr("(100000 bytes)"));
  EXPECT_THAT(message, HasSubstr("; and 41 more problems"));
  EXPECT_LT(message.size(), 4096u);
}

TEST(SpecValidationTest, ReportsEveryProblemAtOnce) {
  JobSpec spec = GoodSpec();
  spec.mutable_model()->set_num_layers(0);
  spec.mutable_data()->clear_train_path();
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_THAT(std::string(status.message()), HasSubstr("spec.model.num_layers"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("spec.data.train_path"));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A field written as 0 is kept as written, never replaced by its default:
// refused where 0 is out of range, taken where it is a value.
TEST(SpecValidationTest, AnExplicitZeroIsKeptOrRefusedNeverReplaced) {
  auto prepared = [](const std::string& extra) {
    auto spec = ParseJobSpecYaml(
        "model: {num_layers: 2, d_model: 64, num_heads: 4}\n"
        "data: {train_path: /data/corpus, seq_len: 128}\n"
        "training: {max_steps: 10}\n" + extra);
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::Status s = PrepareJobSpec(&*spec);
    return std::make_pair(s, *spec);
  };
  for (const auto& [yaml, field] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer: {lr: 0}", "optimizer.lr"},
           {"optimizer: {eps: 0}", "optimizer.eps"},
           {"training: {max_steps: 10, micro_batch_rows: 0}", "training.micro_batch_rows"},
           {"training: {max_steps: 10, global_batch_tokens: 0}",
            "training.global_batch_tokens"}}) {
    std::string text = yaml;
    // The training line above is replaced, not repeated.
    auto spec = ParseJobSpecYaml(
        "model: {num_layers: 2, d_model: 64, num_heads: 4}\n"
        "data: {train_path: /data/corpus, seq_len: 128}\n" +
        (absl::StartsWith(text, "training") ? text : "training: {max_steps: 10}\n" + text));
    ASSERT_TRUE(spec.ok()) << spec.status();
    const absl::Status s = PrepareJobSpec(&*spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(s.message()), HasSubstr("spec." + field + ":")) << yaml;
  }
  // 0 is a value for the betas: kept.
  auto [ok, spec] = prepared("optimizer: {beta1: 0, beta2: 0}");
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(spec.optimizer().beta1(), 0);
  EXPECT_EQ(spec.optimizer().beta2(), 0);
  // Unset: the defaults.
  auto [ok2, plain] = prepared("");
  EXPECT_TRUE(ok2.ok()) << ok2;
  EXPECT_EQ(plain.optimizer().lr(), 3e-4);
  EXPECT_EQ(plain.optimizer().beta1(), 0.9);
  EXPECT_EQ(plain.optimizer().eps(), 1e-8);
  EXPECT_EQ(plain.training().micro_batch_rows(), 8);
  EXPECT_EQ(plain.training().global_batch_tokens(), 128 * 8);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A timing calibration of two specs, after defaults.
JobSpec CalibrationJob() {
  JobSpec spec = GoodSpec();
  spec.mutable_training()->set_max_steps(2 * 3 * 6);  // the calibration's steps in all
  for (const char* name : {"naive", "packed"}) {
    auto* v = spec.mutable_calibration()->add_variants();
    v->set_name(name);
    *v->mutable_spec() = GoodSpec();
    v->mutable_spec()->clear_optimizer();  // defaults fill it again
  }
  ApplySpecDefaults(&spec);
  return spec;
}

TEST(CalibrationSpecTest, DefaultsFillTheCalibrationAndItsSpecs) {
  const JobSpec spec = CalibrationJob();
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(spec.calibration().rounds(), kDefaultCalibrationRounds);
  EXPECT_EQ(spec.calibration().steps(), kDefaultCalibrationSteps);
  EXPECT_DOUBLE_EQ(spec.calibration().variants(1).spec().optimizer().lr(), 3e-4);
}

TEST(CalibrationSpecTest, EachProblemNamesItsField) {
  JobSpec spec = CalibrationJob();
  spec.mutable_calibration()->set_rounds(21);
  spec.mutable_calibration()->set_steps(-1);
  spec.mutable_calibration()->mutable_variants(1)->set_name("naive");
  spec.mutable_calibration()->mutable_variants(0)->mutable_spec()->mutable_data()->set_seq_len(0);
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_THAT(s.message(), HasSubstr("spec.calibration.rounds: must be between 1 and 20"));
  EXPECT_THAT(s.message(), HasSubstr("spec.calibration.steps: must be between 1 and 50"));
  EXPECT_THAT(s.message(), HasSubstr("spec.calibration.variants[1].name: \"naive\" is listed twice"));
  EXPECT_THAT(s.message(), HasSubstr("spec.calibration.variants[0].spec: spec.data.seq_len"));

  JobSpec steps = CalibrationJob();
  steps.mutable_training()->set_max_steps(10);
  EXPECT_THAT(ValidateJobSpec(steps).message(),
              HasSubstr("spec.training.max_steps: a calibration trains 36 steps in all "
                        "(calibration.variants x rounds x (steps + 1)); set it to 36, got 10"));

  JobSpec bad_name = CalibrationJob();
  bad_name.mutable_calibration()->mutable_variants(0)->set_name("Bad Name\n");
  EXPECT_THAT(ValidateJobSpec(bad_name).message(),
              HasSubstr("spec.calibration.variants[0].name: \"Bad Name\\n\" must be 1 to 64"));
}

TEST(CalibrationSpecTest, NoCalibrationInsideOneAndNotTooMany) {
  JobSpec nested = CalibrationJob();
  *nested.mutable_calibration()->mutable_variants(0)->mutable_spec() = CalibrationJob();
  EXPECT_THAT(ValidateJobSpec(nested).message(),
              HasSubstr("spec.calibration.variants[0].spec.calibration: a spec to time cannot "
                        "be a calibration itself"));
  JobSpec many = GoodSpec();
  for (int i = 0; i < 33; ++i) {
    auto* v = many.mutable_calibration()->add_variants();
    v->set_name(absl::StrCat("v", i));
    *v->mutable_spec() = GoodSpec();
  }
  ApplySpecDefaults(&many);
  EXPECT_THAT(ValidateJobSpec(many).message(),
              HasSubstr("spec.calibration.variants: must list 1 to 32 specs to time, got 33"));
  JobSpec none = GoodSpec();
  none.mutable_calibration()->set_rounds(1);
  ApplySpecDefaults(&none);
  EXPECT_THAT(ValidateJobSpec(none).message(), HasSubstr("got 0"));
}

}  // namespace
}  // namespace tally
