#include "common/spec_yaml.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

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
        BadYaml{"- 1\n- 2", "spec (line 1): expected a mapping"}));

}  // namespace
}  // namespace tally
