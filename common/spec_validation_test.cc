#include "common/spec_validation.h"

#include <functional>
#include <string>

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

TEST(SpecValidationTest, GoodSpecIsValidAfterDefaults) {
  JobSpec spec = GoodSpec();
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(spec.resources().gpu_type(), "cpu");
  EXPECT_EQ(spec.resources().gpu_count(), 1);
  EXPECT_EQ(spec.max_attempts(), 3);
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
        BadCase{"divergence_below_one",
                [](JobSpec* s) {
                  s->mutable_early_stopping()->set_divergence_factor(0.5);
                },
                "early_stopping.divergence_factor"},
        BadCase{"label_key",
                [](JobSpec* s) { (*s->mutable_labels())["Team"] = "x"; },
                "labels[\"Team\"]"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

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
