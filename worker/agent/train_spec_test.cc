#include "worker/agent/train_spec.h"

#include "common/spec_yaml.h"
#include "gtest/gtest.h"

namespace tally::worker {
namespace {

tally::v1::JobSpec Spec(const std::string& extra = "") {
  auto spec = ParseJobSpecYaml(R"(
model: {num_layers: 2, d_model: 64, num_heads: 4}
data: {train_path: data/train, seq_len: 128, packing: pad_to_longest}
training: {max_steps: 10, micro_batch_rows: 4, global_batch_tokens: 1024, seed: 3}
optimizer: {lr: 1e-3, warmup_steps: 2, grad_clip: 1.0}
)" + extra);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(TrainSpecTest, MapsEveryFieldWithDefaults) {
  DeviceOptions d;
  d.checkpoint_dir = "/ckpt/job-1";
  auto c = TrainConfigFromSpec(Spec(), d);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.num_layers, 2);
  EXPECT_EQ(c->model.d_model, 64);
  EXPECT_EQ(c->data.packing, data::PackingMode::kPadToLongest);
  EXPECT_EQ(c->data.seq_len, 128);
  EXPECT_EQ(c->data.shuffle_window, 1024);  // default
  EXPECT_EQ(c->global_batch_tokens, 1024);
  EXPECT_EQ(c->micro_batch_rows, 4);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.95);  // default
  EXPECT_EQ(c->seed, 3u);
  EXPECT_EQ(c->checkpoint_dir, "/ckpt/job-1");
  EXPECT_EQ(c->device, "cpu");
}

TEST(TrainSpecTest, RefusesWhatThisTrainerCannotDoNamingTheField) {
  DeviceOptions cpu;
  auto rowwise = TrainConfigFromSpec(
      Spec("precision: {compute: fp8, fp8_recipe: rowwise}\n"), cpu);
  ASSERT_TRUE(rowwise.ok()) << rowwise.status();
  EXPECT_EQ(rowwise->fp8_recipe.recipe, precision::Recipe::kRowwise);
  // BF16 on a CPU worker: autocast, as on CUDA.
  auto bf16 = TrainConfigFromSpec(Spec("precision: {compute: bf16}\n"), cpu);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(bf16->bf16);
  EXPECT_FALSE(bf16->fp8);
  EXPECT_FALSE(TrainConfigFromSpec(Spec(), cpu)->bf16) << "CPU workers default to FP32";
  DeviceOptions gpu = cpu;
  gpu.device = "cuda:0";
  auto fp32 = TrainConfigFromSpec(Spec("precision: {compute: fp32}\n"), gpu);
  EXPECT_NE(fp32.status().message().find("spec.precision.compute"), std::string::npos)
      << fp32.status();
  // A rank of a multi-GPU job needs to know where the ranks meet.
  DeviceOptions rank1 = cpu;
  rank1.parallel.rank = 1;
  rank1.parallel.world_size = 2;
  auto lost = TrainConfigFromSpec(Spec("resources: {gpu_count: 2}\n"), rank1);
  EXPECT_NE(lost.status().message().find("rendezvous"), std::string::npos) << lost.status();
  rank1.parallel.rendezvous = "10.0.0.5:29500";
  auto two = TrainConfigFromSpec(Spec("resources: {gpu_count: 2}\n"), rank1);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->parallel.world_size, 2);
  EXPECT_EQ(two->parallel.rank, 1);
  EXPECT_EQ(two->global_batch_tokens % (2 * two->data.seq_len * two->micro_batch_rows), 0);
  tally::v1::JobSpec bad = Spec();
  bad.mutable_model()->set_num_heads(5);
  EXPECT_NE(TrainConfigFromSpec(bad, cpu).status().message().find("spec.model.num_heads"),
            std::string::npos);
}

TEST(TrainSpecTest, Fp8MapsItsRecipe) {
  auto c = TrainConfigFromSpec(
      Spec("precision: {compute: fp8, fp8_recipe: current, amax_history_len: 4, fp8_margin: 1}\n"),
      DeviceOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp8);
  EXPECT_EQ(c->fp8_recipe.recipe, precision::Recipe::kCurrent);
  EXPECT_EQ(c->fp8_recipe.history_len, 4);
  EXPECT_EQ(c->fp8_recipe.margin, 1);
  auto d = TrainConfigFromSpec(Spec("precision: {compute: fp8}\n"), DeviceOptions{});
  EXPECT_EQ(d->fp8_recipe.recipe, precision::Recipe::kDelayed);
  EXPECT_EQ(d->fp8_recipe.history_len, 16);  // the spec's default
}

TEST(TrainSpecTest, MoeMapsEveryField) {
  tally::v1::JobSpec spec = Spec();
  ASSERT_TRUE(ParseYamlInto("{num_experts: 8, top_k: 2, every_n_layers: 2, shared_expert: true, "
                            "router: sigmoid, capacity_factor: 1.25, aux_loss_coef: 0.01, "
                            "z_loss_coef: 0.001, bias_balancing: true}",
                            spec.mutable_model()->mutable_moe(), "spec.model.moe")
                  .ok());
  auto c = TrainConfigFromSpec(spec, DeviceOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.moe.num_experts, 8);
  EXPECT_EQ(c->model.moe.top_k, 2);
  EXPECT_EQ(c->model.moe.every_n_layers, 2);
  EXPECT_TRUE(c->model.moe.shared_expert);
  EXPECT_TRUE(c->model.moe.sigmoid_router);
  EXPECT_DOUBLE_EQ(c->model.moe.capacity_factor, 1.25);
  EXPECT_DOUBLE_EQ(c->optimizer.moe_aux_loss_coef, 0.01);
  EXPECT_TRUE(c->optimizer.moe_bias_balancing);
}

TEST(TrainSpecTest, PeakFlops) {
  EXPECT_DOUBLE_EQ(PeakFlopsFor("H200"), 989e12);
  EXPECT_DOUBLE_EQ(PeakFlopsFor("cpu"), 0);
}

}  // namespace
}  // namespace tally::worker
