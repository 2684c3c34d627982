#include "server/api/data_roots.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/experiment_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A real folder tree:
//   T/data/corpus/train.{json,idx,bin}
//   T/data/link-out -> T/outside        (a folder link leaving the root)
//   T/data/link-in -> T/data/corpus     (a folder link staying inside)
//   T/data/corpus/evil.bin -> T/outside/secret.bin
//   T/data/corpus/dangling -> T/nowhere
//   T/data2/x                           (a sibling whose name extends "data")
//   T/outside/secret.bin
//   T/work                              (the base for relative paths)
class DataRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = fs::temp_directory_path() /
         ("data_roots_test_" + std::to_string(getpid()) + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(t_);
    t_ = fs::weakly_canonical(t_);
    fs::create_directories(t_ / "data/corpus");
    fs::create_directories(t_ / "data2");
    fs::create_directories(t_ / "outside");
    fs::create_directories(t_ / "work");
    for (const char* ext : {".json", ".idx", ".bin"}) {
      std::ofstream(t_ / "data/corpus" / (std::string("train") + ext)) << "x";
    }
    std::ofstream(t_ / "outside/secret.bin") << "x";
    std::ofstream(t_ / "data2/x") << "x";
    fs::create_directory_symlink(t_ / "outside", t_ / "data/link-out");
    fs::create_directory_symlink(t_ / "data/corpus", t_ / "data/link-in");
    fs::create_symlink(t_ / "outside/secret.bin", t_ / "data/corpus/evil.bin");
    fs::create_symlink(t_ / "nowhere", t_ / "data/corpus/dangling");
  }
  void TearDown() override { fs::remove_all(t_); }

  DataRoots Roots() {
    auto roots = DataRoots::Make({(t_ / "data").string()}, t_ / "work");
    EXPECT_TRUE(roots.ok()) << roots.status();
    return *roots;
  }

  fs::path t_;
};

TEST_F(DataRootsTest, NoRootsChecksNothing) {
  DataRoots none;
  EXPECT_FALSE(none.checking());
  EXPECT_TRUE(none.CheckDataset("spec.data.train_path", "/etc/passwd").ok());
}

TEST_F(DataRootsTest, MakeCanonicalisesAndRefusesMissingRoots) {
  auto roots =
      DataRoots::Make({"../data", (t_ / "data/").string(), (t_ / "data2").string()}, t_ / "work");
  ASSERT_TRUE(roots.ok()) << roots.status();
  ASSERT_EQ(roots->roots().size(), 2u);
  EXPECT_EQ(roots->roots()[0], t_ / "data");
  EXPECT_EQ(roots->Describe(), (t_ / "data").string() + ", " + (t_ / "data2").string());

  auto missing = DataRoots::Make({(t_ / "nope").string()}, t_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(StartsWith("--data_roots: "), HasSubstr((t_ / "nope").string())));
  auto file = DataRoots::Make({(t_ / "data2/x").string()}, t_);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("is not a directory"));
  auto empty = DataRoots::Make({(t_ / "data").string(), ""}, t_);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty root"));
}

TEST_F(DataRootsTest, AcceptsDatasetsInsideARoot) {
  const DataRoots roots = Roots();
  for (const std::string& ok : {
           (t_ / "data/corpus/train").string(),
           (t_ / "data/corpus/not-written-yet").string(),  // files need not exist
           (t_ / "data/new-folder/train").string(),
           (t_ / "data/link-in/train").string(),  // a link staying inside
           (t_ / "data/corpus/../corpus/train").string(),
           std::string("../data/corpus/train"),  // relative to the base
       }) {
    EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", ok).ok())
        << ok << ": " << roots.CheckDataset("spec.data.train_path", ok);
  }
  // An empty val_path (the split beside train_path) is not checked here.
  tally::v1::JobSpec spec;
  spec.mutable_data()->set_train_path((t_ / "data/corpus/train").string());
  EXPECT_TRUE(roots.CheckJobSpec(spec).ok());
}

TEST_F(DataRootsTest, RefusesPathsThatResolveOutside) {
  const DataRoots roots = Roots();
  struct Case {
    std::string path;
    std::string resolved;  // what it resolves to: never in the message
  };
  const Case cases[] = {
      {"../../../../../../../../etc/x", "/etc/x"},
      {(t_ / "data/../outside/train").string(), (t_ / "outside/train").string()},
      {(t_ / "data/link-out/train").string(), (t_ / "outside/train").string()},
      {(t_ / "data2/x").string(), (t_ / "data2/x").string()},
      {"/etc/passwd", "/etc/passwd"},
      // The root itself as the prefix: its files are in the folder above.
      {(t_ / "data").string(), (t_ / "data.json").string()},
      // A prefix inside whose .bin file is a link out.
      {(t_ / "data/corpus/evil").string(), (t_ / "outside/secret.bin").string()},
  };
  for (const Case& c : cases) {
    const absl::Status s = roots.CheckDataset("spec.data.train_path", c.path);
    ASSERT_FALSE(s.ok()) << c.path;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                AllOf(StartsWith("spec.data.train_path \"" + c.path + "\""),
                      HasSubstr("is outside tallyd's --data_roots (" + (t_ / "data").string() +
                                ")"),
                      HasSubstr("put the dataset under a data root")))
        << c.path;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("resolves to"))) << c.path;
    // Unless it is part of what was sent (a file name the caller's prefix
    // makes, a path that resolves to itself).
    if (c.path.find(c.resolved) == std::string::npos &&
        c.resolved.find(c.path) == std::string::npos) {
      EXPECT_THAT(std::string(s.message()), Not(HasSubstr(c.resolved))) << c.path;
    }
  }
}

TEST_F(DataRootsTest, RefusesADanglingLinkAndANulByte) {
  const DataRoots roots = Roots();
  const absl::Status dangling =
      roots.CheckDataset("spec.data.val_path", (t_ / "data/corpus/dangling/x").string());
  EXPECT_EQ(dangling.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dangling.message()),
              AllOf(StartsWith("spec.data.val_path \""),
                    HasSubstr("a symlink whose target does not exist"),
                    Not(HasSubstr((t_ / "nowhere").string()))));
  const absl::Status nul = roots.CheckDataset("spec.data.train_path", std::string("/data/a\0b", 9));
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nul.message()), HasSubstr("NUL byte"));
}

TEST_F(DataRootsTest, ChecksBothPathsOfAJobSpec) {
  const DataRoots roots = Roots();
  tally::v1::JobSpec spec;
  spec.mutable_data()->set_train_path((t_ / "data/corpus/train").string());
  EXPECT_TRUE(roots.CheckJobSpec(spec).ok());
  spec.mutable_data()->set_val_path("/etc/shadow");
  const absl::Status s = roots.CheckJobSpec(spec, "variants[0] (a): ");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("variants[0] (a): spec.data.val_path \"/etc/shadow\" "
                         "is outside tallyd's --data_roots"));
}

// A distillation teacher is read like model.init_from: confined the same
// way, named by its own field.
TEST_F(DataRootsTest, ConfinesTheDistillationTeacher) {
  const DataRoots roots = Roots();
  tally::v1::JobSpec spec;
  spec.mutable_data()->set_train_path((t_ / "data/corpus/train").string());
  spec.mutable_training()->mutable_distill()->mutable_teacher()->set_checkpoint(
      (t_ / "data/corpus/teacher.ckpt").string());
  EXPECT_TRUE(roots.CheckJobSpec(spec).ok());
  spec.mutable_training()->mutable_distill()->mutable_teacher()->set_checkpoint(
      "/etc/teacher.ckpt");
  absl::Status s = roots.CheckJobSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("spec.training.distill.teacher.checkpoint \"/etc/teacher.ckpt\" "
                         "is outside tallyd's --data_roots"));
  spec.mutable_training()->mutable_distill()->mutable_teacher()->clear_checkpoint();
  spec.mutable_training()->mutable_distill()->mutable_teacher()->set_hf("/opt/models/teacher");
  s = roots.CheckJobSpec(spec);
  EXPECT_THAT(std::string(s.message()), StartsWith("spec.training.distill.teacher.hf"));
}

TEST_F(DataRootsTest, NamesTheVariantOfAnExperiment) {
  const DataRoots roots = Roots();
  const std::string base = absl::StrCat(
      "base:\n"
      "  model: {num_layers: 2, d_model: 64, num_heads: 4}\n"
      "  data: {train_path: ",
      (t_ / "data/corpus/train").string(),
      ", seq_len: 128}\n"
      "  training: {max_steps: 100}\n"
      "target: {val_loss: 2.5}\n"
      "variants:\n"
      "  - name: inside\n"
      "    overrides: {}\n");
  absl::StatusOr<tally::v1::ExperimentSpec> ok = ParseExperimentYaml(base);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(roots.CheckExperimentSpec(*ok).ok()) << roots.CheckExperimentSpec(*ok);

  absl::StatusOr<tally::v1::ExperimentSpec> escapes = ParseExperimentYaml(absl::StrCat(
      base,
      "  - name: escapes\n    overrides: {data: {train_path: ../../../../../../../../etc/x}}\n"));
  ASSERT_TRUE(escapes.ok()) << escapes.status();
  const absl::Status s = roots.CheckExperimentSpec(*escapes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(s.message()),
      StartsWith("variants[1] (escapes): spec.data.train_path \"../../../../../../../../etc/x\" "
                 "is outside tallyd's --data_roots"));
}

// A refusal names what the caller sent and the roots as configured, never
// what a path resolves to on tallyd's host: /proc/self/cwd is tallyd's
// working directory, /proc/self/exe its binary.
TEST_F(DataRootsTest, RefusalsNeverEchoHostPaths) {
  auto roots = DataRoots::Make({"../data"}, t_ / "work");
  ASSERT_TRUE(roots.ok()) << roots.status();
  const std::string cwd = std::filesystem::current_path().string();
  for (const std::string& path :
       {std::string("/proc/self/cwd/x"), std::string("/proc/self/exe"),
        std::string("/proc/self/root/etc/passwd"), (t_ / "data/link-out/train").string(),
        (t_ / "data/corpus/evil").string()}) {
    const absl::Status s = roots->CheckDataset("spec.data.train_path", path);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    const std::string m(s.message());
    EXPECT_THAT(m, StartsWith("spec.data.train_path \"" + path + "\"")) << m;
    EXPECT_THAT(m, HasSubstr("outside tallyd's --data_roots (../data)")) << m;
    EXPECT_THAT(m, Not(HasSubstr(cwd + "/"))) << m;
    EXPECT_THAT(m, Not(HasSubstr((t_ / "outside").string()))) << m;
  }
}

}  // namespace
}  // namespace tally::api
