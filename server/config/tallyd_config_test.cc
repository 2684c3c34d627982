#include "server/config/tallyd_config.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::config {
namespace {

using ::testing::HasSubstr;

TEST(TallydConfigTest, ParsesThePriceTable) {
  auto c = ParseTallydConfig(R"(
usd_per_gpu_hour: {cpu: 0.05, h200: 3.5}
flops_per_second_per_gpu:
  h200: 4.0e14
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->prices.Price("h200"), 3.5);
  EXPECT_DOUBLE_EQ(c->prices.Price("a100"), 0);
  EXPECT_DOUBLE_EQ(c->prices.flops_per_second_per_gpu.at("h200"), 4e14);
  EXPECT_TRUE(ParseTallydConfig("").ok());
  EXPECT_TRUE(LoadTallydConfig("").ok());
}

TEST(TallydConfigTest, ParsesSpotPrices) {
  auto c = ParseTallydConfig(R"(
usd_per_gpu_hour: {cpu: 0.05, h200: 3.5}
spot_usd_per_gpu_hour:
  h200: 1.40
  h100: 4.0
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->prices.SpotPrice("h200"), 1.4);
  EXPECT_DOUBLE_EQ(c->prices.SpotPrice("cpu"), 0.05);  // on-demand
  // Above the (absent, so $0) on-demand price: accepted as given.
  EXPECT_DOUBLE_EQ(c->prices.SpotPrice("h100"), 4.0);
  EXPECT_DOUBLE_EQ(c->prices.Price("h200"), 3.5);
  EXPECT_TRUE(ParseTallydConfig("spot_usd_per_gpu_hour: {h200: 0}\n").ok());
}

TEST(TallydConfigTest, BadSpotPricesNameTheKeyAndLine) {
  struct Case {
    std::string yaml;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"spot_usd_per_gpu_hour: {h200: cheap}\n",
            "spot_usd_per_gpu_hour.h200 (line 1): not a number"},
           {"usd_per_gpu_hour: {h200: 3}\nspot_usd_per_gpu_hour:\n  h200: -1\n",
            "spot_usd_per_gpu_hour.h200 (line 3): must be a finite number >= 0"},
           {"spot_usd_per_gpu_hour:\n  h200: .inf\n",
            "spot_usd_per_gpu_hour.h200 (line 2): must be a finite"},
           {"spot_usd_per_gpu_hour: 1.4\n",
            "spot_usd_per_gpu_hour (line 1): expected a mapping of GPU type"},
           {"spot_usd_per_gpu_hour:\n  h200: 1\n  h200: 2\n",
            "spot_usd_per_gpu_hour.h200 (line 3): given twice"},
           {"spot_prices: {h200: 1}\n", "spot_usd_per_gpu_hour"},
       }) {
    auto parsed = ParseTallydConfig(c.yaml);
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.yaml;
  }
  TallydConfig c;
  c.prices.spot_usd_per_gpu_hour["h200"] = -0.5;
  EXPECT_THAT(c.Validate().message(), HasSubstr("spot_usd_per_gpu_hour.h200"));
}

// examples/tallyd.yaml, found above the test's working directory (a build
// directory inside the source tree) or beside this file; empty if neither.
std::filesystem::path FindExampleConfig() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path dir = fs::current_path(ec); !ec && !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "examples/tallyd.yaml", ec)) return dir / "examples/tallyd.yaml";
    if (dir == dir.parent_path()) break;
  }
  const fs::path beside = fs::path(__FILE__).parent_path() / "../../examples/tallyd.yaml";
  return fs::exists(beside, ec) ? beside : fs::path();
}

TEST(TallydConfigTest, TheExampleConfigParses) {
  const std::filesystem::path example = FindExampleConfig();
  if (example.empty()) GTEST_SKIP() << "examples/tallyd.yaml not found above the working directory";
  auto c = LoadTallydConfig(example.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->prices.SpotPrice("h200"), 0);
  EXPECT_LT(c->prices.SpotPrice("h200"), c->prices.Price("h200"));
}

TEST(TallydConfigTest, BadConfigNamesTheKeyAndLine) {
  struct Case {
    std::string yaml;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"usd_per_gpu_hour: {cpu: cheap}\n", "usd_per_gpu_hour.cpu (line 1): not a number"},
           {"prices: {cpu: 1}\n", "prices (line 1): unknown key"},
           {"usd_per_gpu_hour:\n  cpu: -1\n", "usd_per_gpu_hour.cpu (line 2): must be a finite"},
           {"usd_per_gpu_hour:\n  cpu: .nan\n", "usd_per_gpu_hour.cpu (line 2): must be a finite"},
           {"flops_per_second_per_gpu: {cpu: 0}\n", "> 0"},
           {"usd_per_gpu_hour: [1, 2]", "expected a mapping of GPU type"},
           {"usd_per_gpu_hour:\n  cpu: 1\n  cpu: 2\n", "usd_per_gpu_hour.cpu (line 3): given twice"},
           {"{unclosed", "not valid YAML"},
           {"- 1\n- 2\n", "expected a mapping at the top level"},
       }) {
    auto parsed = ParseTallydConfig(c.yaml);
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.yaml;
  }
}

TEST(TallydConfigTest, ValidateRefusesWhatParsingWould) {
  TallydConfig c;
  c.prices.usd_per_gpu_hour["cpu"] = -0.5;
  EXPECT_THAT(c.Validate().message(), HasSubstr("usd_per_gpu_hour.cpu"));
  c.prices.usd_per_gpu_hour["cpu"] = 0.5;
  EXPECT_TRUE(c.Validate().ok());
}

TEST(TallydConfigTest, AHugeFileIsRefusedBeforeParsing) {
  std::string big(kMaxConfigBytes + 1, '#');
  auto c = ParseTallydConfig(big);
  EXPECT_THAT(c.status().message(), HasSubstr("at most"));
}

TEST(TallydConfigTest, AMissingFileIsNotFound) {
  auto c = LoadTallydConfig("/nonexistent/tally.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("--config: cannot read /nonexistent/tally.yaml"));
}

TEST(TallydConfigTest, TenantQuotas) {
  auto c = ParseTallydConfig(
      "tenants:\n"
      "  research: {max_gpus: 8, max_dollars_per_day: 200, max_dollars_per_month: 3000}\n"
      "  dev: {max_dollars_per_day: 5.5}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->quotas.size(), 2u);
  EXPECT_EQ(c->quotas.at("research").max_gpus, 8);
  EXPECT_EQ(c->quotas.at("research").max_dollars_per_month, 3000);
  EXPECT_EQ(c->quotas.at("dev").max_gpus, 0);
  EXPECT_EQ(c->quotas.at("dev").max_dollars_per_day, 5.5);
  struct Case {
    const char* yaml;
    const char* error;
  };
  for (const Case& bad : std::vector<Case>{
           {"tenants: [a]\n", "tenants (line 1): expected a mapping"},
           {"tenants: {research: 3}\n", "tenants.research (line 1): expected a mapping"},
           {"tenants: {research: {max_gpus: 1.5}}\n", "tenants.research.max_gpus"},
           {"tenants: {research: {max_gpus: -1}}\n", ">= 0"},
           {"tenants: {research: {max_dollars_per_day: .nan}}\n", "max_dollars_per_day"},
           {"tenants: {research: {max_dollars_per_week: 3}}\n", "unknown key"},
           {"tenants: {research: {max_gpus: x}}\n", "not a number"},
       }) {
    auto parsed = ParseTallydConfig(bad.yaml);
    ASSERT_FALSE(parsed.ok()) << bad.yaml;
    EXPECT_THAT(parsed.status().message(), HasSubstr(bad.error)) << bad.yaml;
  }
}

}  // namespace
}  // namespace tally::config

namespace tally::config {
namespace {

TEST(TallydConfigTest, WorkerGpuTypesAreKnownBesideThePricedOnes) {
  auto c = ParseTallydConfig("usd_per_gpu_hour: {h200: 3.5}\nworker_gpu_types: [l4, cpu-forced]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prices.worker_gpu_types, (std::vector<std::string>{"l4", "cpu-forced"}));
  EXPECT_EQ(c->prices.KnownGpuTypes(), (std::vector<std::string>{"cpu-forced", "h200", "l4"}));
  EXPECT_TRUE(ParseTallydConfig("")->prices.KnownGpuTypes().empty());
}

TEST(TallydConfigTest, BadWorkerGpuTypesNameTheEntryAndLine) {
  auto notalist = ParseTallydConfig("worker_gpu_types: l4\n");
  EXPECT_THAT(notalist.status().message(),
              HasSubstr("worker_gpu_types (line 1): expected a list of GPU types"));
  auto twice = ParseTallydConfig("worker_gpu_types:\n  - l4\n  - l4\n");
  EXPECT_THAT(twice.status().message(), HasSubstr("worker_gpu_types (line 3): l4 is listed twice"));
  auto bad = ParseTallydConfig("worker_gpu_types: [\"a b\"]\n");
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("worker_gpu_types entry: must be 1-64 characters"),
                    HasSubstr("(line 1)")));
}

TEST(TallydConfigTest, CheckpointRootIsAnAbsolutePathWithoutDots) {
  auto c = ParseTallydConfig("checkpoint_root: /mnt/ckpt/\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_root, "/mnt/ckpt");
  for (const char* bad : {"checkpoint_root: ckpt\n", "checkpoint_root: /mnt/../etc\n",
                          "checkpoint_root: /\n", "checkpoint_root: [a]\n"}) {
    EXPECT_THAT(ParseTallydConfig(bad).status().message(), HasSubstr("checkpoint_root (line 1)"))
        << bad;
  }
}

}  // namespace
}  // namespace tally::config
