#include "worker/dist/step_reduce.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The collective's vector for 4 parameters and MoE layers of 3 and 2
// experts, every value distinct, so a field read from the wrong place shows.
const std::vector<double> kPacked = {
    1234.5, 0.25, 1000, 24,    // loss, aux loss, real and padding tokens
    1,                         // votes.now
    3, 5, 7000, 11, 13,        // FP8 overflows .. total_products
    1,                         // ranks with a non-finite amax
    0, 1,                      // votes.keep_state, votes.preempt
    0.375,                     // distillation KL sum
    1, 0, 1, 1,                // ranks with a gradient, by parameter
    0.125,                     // sharded gradient square sum
    10, 20, 30, 1.5, 60, 2,    // layer 0: tokens per expert, entropy, assignments, dropped
    4, 0, 0.75, 4, 0};         // layer 1
StepSumsLayout Layout() { return {4, {3, 2}}; }

TEST(StepReduceTest, EveryFieldHasItsPlaceInTheCollective) {
  // The order the trainer's end-of-step all-reduce has always used: a rank
  // running another order would sum mismatched fields.
  auto s = UnpackStepSums(kPacked, Layout());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->loss_sum, 1234.5);
  EXPECT_EQ(s->aux_loss_sum, 0.25);
  EXPECT_EQ(s->real_tokens, 1000);
  EXPECT_EQ(s->padding_tokens, 24);
  EXPECT_EQ(s->votes.now, 1);
  EXPECT_EQ(s->votes.keep_state, 0);
  EXPECT_EQ(s->votes.preempt, 1);
  EXPECT_EQ(s->distill_kl_sum, 0.375);
  EXPECT_EQ(s->fp8.overflows, 3);
  EXPECT_EQ(s->fp8.underflows, 5);
  EXPECT_EQ(s->fp8.elements, 7000);
  EXPECT_EQ(s->fp8.fp8_products, 11);
  EXPECT_EQ(s->fp8.total_products, 13);
  EXPECT_EQ(s->ranks_with_nonfinite_amax, 1);
  EXPECT_THAT(s->ranks_with_grad, ElementsAre(1, 0, 1, 1));
  EXPECT_EQ(s->sharded_grad_square_sum, 0.125);
  ASSERT_EQ(s->moe_layers.size(), 2u);
  EXPECT_THAT(s->moe_layers[0].tokens_per_expert, ElementsAre(10, 20, 30));
  EXPECT_EQ(s->moe_layers[0].router_entropy, 1.5);
  EXPECT_EQ(s->moe_layers[0].assignments, 60);
  EXPECT_EQ(s->moe_layers[0].dropped, 2);
  EXPECT_THAT(s->moe_layers[1].tokens_per_expert, ElementsAre(4, 0));
  EXPECT_EQ(s->moe_layers[1].router_entropy, 0.75);
  EXPECT_EQ(s->moe_layers[1].assignments, 4);
  EXPECT_EQ(s->moe_layers[1].dropped, 0);
}

TEST(StepReduceTest, RoundTrips) {
  auto s = UnpackStepSums(kPacked, Layout());
  ASSERT_TRUE(s.ok()) << s.status();
  const StepSumsLayout layout = LayoutOf(*s);
  EXPECT_EQ(layout.num_parameters, 4u);
  EXPECT_THAT(layout.experts_per_moe_layer, ElementsAre(3, 2));
  EXPECT_EQ(PackStepSums(*s), kPacked);

  const StepSums dense;  // no parameters, no MoE
  const std::vector<double> packed = PackStepSums(dense);
  EXPECT_EQ(packed.size(), 15u);
  auto back = UnpackStepSums(packed, LayoutOf(dense));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(PackStepSums(*back), packed);
}

TEST(StepReduceTest, SummingPackedVectorsSumsEveryField) {
  // What the all-reduce does with two ranks: an element-wise sum.
  StepSums b = *UnpackStepSums(kPacked, Layout());
  b.loss_sum = 0.5;
  b.votes = {0, 1, 0};
  b.ranks_with_grad = {0, 0, 1, 0};
  b.moe_layers[1].tokens_per_expert = {1, 2};
  std::vector<double> sum = kPacked;
  const std::vector<double> other = PackStepSums(b);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
  auto s = UnpackStepSums(sum, Layout());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(PackStepSums(*s),
              ElementsAre(1235, 0.5, 2000, 48, 1, 6, 10, 14000, 22, 26, 2, 1, 1, 0.75,  //
                          1, 0, 2, 1, 0.25, 20, 40, 60, 3, 120, 4, 5, 2, 1.5, 8, 0));
  // One rank preempted and the other kept the state: both are preempted.
  EXPECT_EQ(s->votes.Decide(), StepEnd::kPreempt);
  EXPECT_THAT(s->ranks_with_grad, ElementsAre(1, 0, 2, 1));
}

TEST(StepReduceTest, AWrongSizeIsAnErrorNotARead) {
  std::vector<double> v = kPacked;
  v.pop_back();
  auto short_one = UnpackStepSums(v, Layout());
  EXPECT_EQ(short_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_one.status().message(), HasSubstr("4 parameters and 2 MoE layers"));
  v.push_back(0);
  v.push_back(0);
  EXPECT_FALSE(UnpackStepSums(v, Layout()).ok());
  EXPECT_FALSE(UnpackStepSums({}, StepSumsLayout{}).ok());
}

TEST(StepReduceTest, VotesDecideByPrecedence) {
  struct Case {
    StopVotes votes;
    StepEnd want;
  };
  const Case cases[] = {
      {{0, 0, 0}, StepEnd::kContinue},
      {{1, 0, 0}, StepEnd::kStopNow},
      {{3, 0, 0}, StepEnd::kStopNow},
      {{0, 1, 0}, StepEnd::kKeepState},
      {{1, 1, 0}, StepEnd::kKeepState},  // the checkpoint needs every rank
      {{0, 0, 1}, StepEnd::kPreempt},
      {{0, 2, 1}, StepEnd::kPreempt},
      {{1, 0, 1}, StepEnd::kPreempt},
      {{1, 1, 1}, StepEnd::kPreempt},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.votes.Decide(), c.want)
        << "now " << c.votes.now << " keep " << c.votes.keep_state << " preempt "
        << c.votes.preempt;
  }
}

}  // namespace
}  // namespace tally::dist
