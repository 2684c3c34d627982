#include "worker/train/model_io.h"

#include <unistd.h>

#include <cmath>
#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/transformer.h"
#include "worker/train/checkpoint.h"

namespace tally::train {
namespace {

using ::testing::HasSubstr;

model::ModelConfig Shape() {
  model::ModelConfig c;
  c.num_layers = 2;
  c.d_model = 64;
  c.num_heads = 4;
  c.d_ff = 0;
  c.vocab_size = 0;
  return c;
}

TEST(ModelIo, ReconcileFillsUnsetFieldsAndRefusesContradictions) {
  model::ModelConfig theirs = Shape();
  theirs.d_ff = 160;
  theirs.vocab_size = 32000;
  theirs.rope_theta = 500000;
  theirs.norm_eps = 1e-6;
  model::ModelConfig spec = Shape();
  ASSERT_TRUE(ReconcileModel(theirs, "DIR/config.json", &spec).ok());
  EXPECT_EQ(spec.d_ff, 160);
  EXPECT_EQ(spec.vocab_size, 32000);
  EXPECT_EQ(spec.rope_theta, 500000);
  EXPECT_EQ(spec.norm_eps, 1e-6);

  struct Case {
    std::function<void(model::ModelConfig*)> change;
    const char* message;
  };
  const Case cases[] = {
      {[](model::ModelConfig* c) { c->d_model = 128; },
       "the spec's model.d_model is 128 but DIR/config.json has 64"},
      {[](model::ModelConfig* c) { c->num_layers = 3; }, "model.num_layers is 3"},
      {[](model::ModelConfig* c) { c->num_heads = 8; }, "model.num_heads is 8"},
      {[](model::ModelConfig* c) { c->d_ff = 128; }, "model.d_ff is 128 but"},
      {[](model::ModelConfig* c) { c->vocab_size = 258; }, "model.vocab_size is 258 but"},
      {[](model::ModelConfig* c) { c->moe.num_experts = 4; }, "model.moe.num_experts is 4"},
  };
  for (const Case& k : cases) {
    model::ModelConfig s = Shape();
    k.change(&s);
    const absl::Status st = ReconcileModel(theirs, "DIR/config.json", &s);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(st.message()), HasSubstr(k.message));
  }
}

TEST(ModelIo, OlderCheckpointsAreReadFromTheirFingerprint) {
  const nlohmann::json meta = {
      {"fingerprint",
       "layers=2 d_model=64 heads=4 d_ff=192 vocab=258 seq_len=256 packing=packed seed=1 "
       "moe=4x2/every1/softmax/cap0"},
      {"step", 10}};
  auto c = ModelConfigFromMetadata(meta);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->d_ff, 192);
  EXPECT_EQ(c->moe.num_experts, 4);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_FALSE(c->moe.sigmoid_router);
  // The model field, when there, wins; and round-trips.
  model::ModelConfig m = Shape();
  m.vocab_size = 1000;
  m.rope_theta = 1e6;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.shared_expert = true;
  const nlohmann::json with_model = {{"model", ModelConfigJson(m)}, {"fingerprint", "junk"}};
  auto back = ModelConfigFromMetadata(with_model);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->vocab_size, 1000);
  EXPECT_EQ(back->rope_theta, 1e6);
  EXPECT_TRUE(back->moe.shared_expert);
  EXPECT_EQ(back->d_ff, 192);  // resolved when recorded
  // Neither: refused, naming what is missing.
  for (const nlohmann::json& bad :
       {nlohmann::json{{"step", 1}}, nlohmann::json{{"fingerprint", "layers=x"}},
        nlohmann::json{{"model", {{"num_layers", 2}}}},
        nlohmann::json{{"model",
                        {{"num_layers", 2},
                         {"d_model", 64},
                         {"num_heads", 3},
                         {"d_ff", 8},
                         {"vocab_size", 9},
                         {"rope_theta", 1.0},
                         {"norm_eps", 1e-5}}}},
        nlohmann::json::array()}) {
    auto r = ModelConfigFromMetadata(bad);
    EXPECT_FALSE(r.ok()) << bad.dump();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// A checkpoint whose metadata claims a larger model than its tensors hold is
// refused before anything of the claimed size is built.
TEST(ModelIo, CheckpointTensorsMustBeTheModelItsMetadataDescribes) {
  char dir[] = "/tmp/tally_model_io_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  model::ModelConfig c = Shape();
  c.vocab_size = 258;
  model::Transformer m(c, 1, at::kCPU);
  CheckpointData data;
  for (const auto& p : m.parameters()) data.tensors.emplace_back("model." + p.name, p.value);
  nlohmann::json meta = {{"step", 3}, {"model", ModelConfigJson(c)}};
  data.metadata_json = meta.dump();
  const std::string good = std::string(dir) + "/good.ckpt";
  ASSERT_TRUE(WriteCheckpoint(good, data).ok());
  auto read = ReadCheckpointModel(good);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 3);
  EXPECT_EQ(read->parameters.size(), m.parameters().size());
  EXPECT_EQ(read->tokenizer["kind"], "byte");  // older checkpoints: the byte tokenizer

  c.d_model = 4096;  // the same tensors, a claim 64x wider
  meta["model"] = ModelConfigJson(c);
  data.metadata_json = meta.dump();
  const std::string big = std::string(dir) + "/big.ckpt";
  ASSERT_TRUE(WriteCheckpoint(big, data).ok());
  auto refused = ReadCheckpointModel(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("tensor model.embed is [258, 64], the model its metadata describes "
                        "has [258, 4096]"));
}

TEST(ModelIo, NonFiniteWeightsAreRefusedNamingTheTensor) {
  char dir[] = "/tmp/tally_model_io_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  model::ModelConfig c = Shape();
  c.vocab_size = 258;
  model::Transformer m(c, 1, at::kCPU);
  for (double bad : {double{NAN}, double{INFINITY}, -double{INFINITY}}) {
    SCOPED_TRACE(bad);
    CheckpointData data;
    for (const auto& p : m.parameters()) {
      at::Tensor t = p.value.detach().clone();
      if (p.name == "layers.1.w2") t[3][4] = bad;
      data.tensors.emplace_back("model." + p.name, t);
    }
    data.metadata_json = nlohmann::json({{"step", 3}, {"model", ModelConfigJson(c)}}).dump();
    const std::string path = std::string(dir) + "/bad.ckpt";
    ASSERT_TRUE(WriteCheckpoint(path, data).ok());
    auto read = ReadCheckpointModel(path);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(read.status().message()),
                HasSubstr(path + ": tensor model.layers.1.w2 holds NaN or infinite values"));
  }
}

}  // namespace
}  // namespace tally::train
