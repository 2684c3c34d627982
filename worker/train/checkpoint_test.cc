#include "worker/train/checkpoint.h"

#include <fstream>

#include "gtest/gtest.h"

namespace tally::train {
namespace {

std::string TempDir() {
  char dir[] = "/tmp/tally_ckpt_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

TEST(CheckpointTest, RoundTripsTensorsAndMetadata) {
  const std::string path = TempDir() + "/a.ckpt";
  CheckpointData data;
  data.metadata_json = R"({"step": 7})";
  data.tensors = {{"w", at::randn({3, 4})}, {"i", at::arange(5, at::kLong)},
                  {"scalar", at::tensor(2.5)}};
  auto sha = WriteCheckpoint(path, data);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(sha->size(), 64u);
  auto back = ReadCheckpoint(path, *sha);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata_json, data.metadata_json);
  ASSERT_EQ(back->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->tensors[i].first, data.tensors[i].first);
    EXPECT_TRUE(at::equal(back->tensors[i].second, data.tensors[i].second));
  }
}

TEST(CheckpointTest, CorruptionAndWrongChecksumAreDataLoss) {
  const std::string path = TempDir() + "/a.ckpt";
  CheckpointData data;
  data.metadata_json = "{}";
  data.tensors = {{"w", at::ones({64})}};
  auto sha = WriteCheckpoint(path, data);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(ReadCheckpoint(path, std::string(64, '0')).status().code(),
            absl::StatusCode::kDataLoss);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto bad = ReadCheckpoint(path, "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(ReadCheckpoint(path + ".missing", "").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tally::train
