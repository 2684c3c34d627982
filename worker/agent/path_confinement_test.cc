// Path confinement on real folders and symlinks under a fresh temporary
// directory.
#include "worker/agent/path_confinement.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class PathConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally_paths_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    // The temporary folder itself may sit behind a symlink (/tmp on some
    // systems): work in its canonical form so expected paths are exact.
    tmp_ = fs::canonical(dir);
    fs::create_directories(tmp_ / "data/corpus");
    fs::create_directories(tmp_ / "data2");
    fs::create_directories(tmp_ / "elsewhere");
    fs::create_directories(tmp_ / "cwd");
    for (const char* f : {"data/corpus/train", "data/corpus/val", "data2/train",
                          "elsewhere/train"}) {
      for (const std::string& file : DatasetFiles((tmp_ / f).string())) Touch(file);
    }
  }
  void TearDown() override { fs::remove_all(tmp_); }

  static void Touch(const std::string& path) { std::ofstream(path) << "x"; }

  DataRoots Roots(const std::vector<std::string>& roots) {
    auto r = DataRoots::Make(roots, tmp_ / "cwd");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : DataRoots();
  }
  std::string T(const std::string& rel) { return (tmp_ / rel).string(); }

  fs::path tmp_;
};

TEST_F(PathConfinementTest, APathInsideARootIsAllowed) {
  DataRoots roots = Roots({T("data")});
  EXPECT_TRUE(roots.confining());
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/corpus/train")).ok());
  // A dataset not there yet is still inside: opening it fails later, as
  // NotFound, not here.
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/corpus/missing")).ok());
}

// model.init_from: a Hugging Face folder's files, or a checkpoint, are
// confined like datasets; a symlink out of the root is caught at the file.
TEST_F(PathConfinementTest, InitFromPathsAreConfined) {
  DataRoots roots = Roots({T("data")});
  fs::create_directories(tmp_ / "data/hf");
  Touch(T("data/hf/config.json"));
  fs::create_symlink(T("elsewhere/train.bin"), T("data/hf/model.safetensors"));
  absl::Status s = roots.CheckInitFrom("spec.", T("data/hf"), "");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("spec.model.init_from.hf"), HasSubstr("model.safetensors")));
  fs::remove(T("data/hf/model.safetensors"));
  Touch(T("data/hf/model.safetensors"));
  EXPECT_TRUE(roots.CheckInitFrom("spec.", T("data/hf"), "").ok());
  EXPECT_TRUE(roots.CheckInitFrom("spec.", "", T("data/a.ckpt")).ok());
  s = roots.CheckInitFrom("spec.", "", T("elsewhere/a.ckpt"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("spec.model.init_from.checkpoint"));
  EXPECT_TRUE(roots.CheckInitFrom("spec.", "", "").ok());
  // A distillation teacher, the same way under its own field.
  s = roots.CheckWeights("spec.training.distill.teacher", "", T("elsewhere/t.ckpt"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("spec.training.distill.teacher.checkpoint"));
  EXPECT_TRUE(roots.CheckWeights("spec.training.distill.teacher", T("data/hf"), "").ok());
}

TEST_F(PathConfinementTest, DotDotOutOfTheRootIsRefusedNamingFieldPathResolutionAndRoots) {
  DataRoots roots = Roots({T("data"), T("data2")});
  const std::string given = T("data/corpus/../../elsewhere/train");
  absl::Status s = roots.CheckDataset("spec.data.train_path", given);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("spec.data.train_path \"" + given + "\""),
                    HasSubstr("resolves to " + T("elsewhere/train")),
                    HasSubstr("outside the worker's data roots (" + T("data") + ", " +
                              T("data2") + ")"),
                    HasSubstr("--data_root")));
}

TEST_F(PathConfinementTest, AnAbsolutePathElsewhereIsRefused) {
  DataRoots roots = Roots({T("data")});
  EXPECT_EQ(roots.CheckDataset("spec.data.train_path", T("elsewhere/train")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(roots.CheckDataset("spec.data.train_path", "/etc/passwd").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(PathConfinementTest, ASymlinkedDatasetFileLeadingOutOfTheRootIsRefused) {
  fs::create_directories(tmp_ / "data/sneaky");
  Touch(T("data/sneaky/train.json"));
  Touch(T("data/sneaky/train.idx"));
  fs::create_symlink(tmp_ / "elsewhere/train.bin", tmp_ / "data/sneaky/train.bin");
  DataRoots roots = Roots({T("data")});
  absl::Status s = roots.CheckDataset("spec.data.train_path", T("data/sneaky/train"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("its file " + T("data/sneaky/train.bin")),
                                 HasSubstr("resolves to " + T("elsewhere/train.bin"))));
}

TEST_F(PathConfinementTest, ASymlinkedFolderLeadingOutOfTheRootIsRefused) {
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "data/link");
  DataRoots roots = Roots({T("data")});
  absl::Status s = roots.CheckDataset("spec.data.train_path", T("data/link/train"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("resolves to " + T("elsewhere/train")));
}

TEST_F(PathConfinementTest, ASymlinkInsideTheRootPointingInsideIsAllowed) {
  fs::create_directory_symlink(tmp_ / "data/corpus", tmp_ / "data/current");
  fs::create_directories(tmp_ / "data/mixed");
  for (const char* ext : {".json", ".idx", ".bin"}) {
    fs::create_symlink(tmp_ / (std::string("data/corpus/train") + ext),
                       tmp_ / (std::string("data/mixed/train") + ext));
  }
  DataRoots roots = Roots({T("data")});
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/current/train")).ok());
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/mixed/train")).ok());
}

TEST_F(PathConfinementTest, ARootReachedThroughASymlinkConfinesToItsTarget) {
  fs::create_directory_symlink(tmp_ / "data", tmp_ / "data-link");
  DataRoots roots = Roots({T("data-link")});
  ASSERT_EQ(roots.roots().size(), 1u);
  EXPECT_EQ(roots.roots()[0], tmp_ / "data");
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data-link/corpus/train")).ok());
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/corpus/train")).ok());
}

TEST_F(PathConfinementTest, ADanglingSymlinkIsRefused) {
  fs::create_directories(tmp_ / "data/dangling");
  Touch(T("data/dangling/train.json"));
  Touch(T("data/dangling/train.idx"));
  fs::create_symlink(tmp_ / "elsewhere/not-yet.bin", tmp_ / "data/dangling/train.bin");
  DataRoots roots = Roots({T("data")});
  absl::Status s = roots.CheckDataset("spec.data.train_path", T("data/dangling/train"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("spec.data.train_path"),
                                 HasSubstr("which does not exist")));
}

TEST_F(PathConfinementTest, ARootGivenWithATrailingSlashIsTheSameRoot) {
  DataRoots roots = Roots({T("data") + "/"});
  ASSERT_EQ(roots.roots().size(), 1u);
  EXPECT_EQ(roots.roots()[0], tmp_ / "data");
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/corpus/train")).ok());
  EXPECT_FALSE(roots.CheckDataset("spec.data.train_path", T("data2/train")).ok());
}

TEST_F(PathConfinementTest, ARootThatIsAStringPrefixOfAnotherFolderDoesNotContainIt) {
  DataRoots roots = Roots({T("data")});
  absl::Status s = roots.CheckDataset("spec.data.train_path", T("data2/train"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_FALSE(IsWithin("/data2/x", "/data"));
  EXPECT_TRUE(IsWithin("/data/x", "/data"));
  EXPECT_TRUE(IsWithin("/data/x", "/data/"));
  EXPECT_TRUE(IsWithin("/data", "/data"));
  EXPECT_TRUE(IsWithin("/anything", "/"));
  EXPECT_FALSE(IsWithin("/dat", "/data"));
}

TEST_F(PathConfinementTest, APrefixThatIsTheRootItselfReadsFilesBesideIt) {
  // "ROOT" as a prefix opens ROOT.json: a sibling of the root, not inside it.
  DataRoots roots = Roots({T("data/corpus")});
  absl::Status s = roots.CheckDataset("spec.data.train_path", T("data/corpus"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("resolves to " + T("data/corpus.json")));
}

TEST_F(PathConfinementTest, RelativePathsAreTakenFromTheWorkingDirectory) {
  // The base is tmp/cwd.
  DataRoots roots = Roots({"../data"});
  ASSERT_EQ(roots.roots().size(), 1u);
  EXPECT_EQ(roots.roots()[0], tmp_ / "data");
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", "../data/corpus/train").ok());
  absl::Status s = roots.CheckDataset("spec.data.train_path", "../elsewhere/train");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"../elsewhere/train\""),
                                 HasSubstr("resolves to " + T("elsewhere/train"))));
  EXPECT_EQ(roots.CheckDataset("spec.data.train_path", "train").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(roots.CheckDataset("spec.data.train_path", "../../../../../../../../etc/x").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(PathConfinementTest, DotDotThroughAFolderThatDoesNotExistStaysLexical) {
  DataRoots roots = Roots({T("data")});
  EXPECT_EQ(roots.CheckDataset("spec.data.train_path", T("data/nope/../../elsewhere/train"))
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", T("data/nope/../corpus/train")).ok());
}

TEST_F(PathConfinementTest, NoRootsConfinesNothing) {
  DataRoots roots = Roots({});
  EXPECT_FALSE(roots.confining());
  EXPECT_TRUE(roots.CheckDataset("spec.data.train_path", "/etc/passwd").ok());
}

TEST_F(PathConfinementTest, ARootThatDoesNotExistOrIsAFileIsRefusedByName) {
  auto missing = DataRoots::Make({T("data"), T("nope")}, tmp_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("--data_root"), HasSubstr(T("nope"))));
  auto file = DataRoots::Make({T("data/corpus/train.bin")}, tmp_);
  EXPECT_THAT(file.status().message(), HasSubstr("is not a directory"));
  EXPECT_FALSE(DataRoots::Make({""}, tmp_).ok());
}

TEST_F(PathConfinementTest, HostilePathsAreRefusedNotCrashedOn) {
  DataRoots roots = Roots({T("data")});
  EXPECT_FALSE(roots.CheckDataset("spec.data.train_path", "").ok());
  EXPECT_FALSE(roots.CheckDataset("spec.data.train_path", std::string("a\0b", 3)).ok());
  EXPECT_FALSE(roots.CheckDataset("spec.data.train_path", std::string(5000, '/') + "x").ok());
  fs::create_symlink(tmp_ / "data/loop-b", tmp_ / "data/loop-a");
  fs::create_symlink(tmp_ / "data/loop-a", tmp_ / "data/loop-b");
  EXPECT_FALSE(roots.CheckDataset("spec.data.train_path", T("data/loop-a/train")).ok());
}

TEST(CheckpointFolderNameTest, JobNamesBecomeOneComponent) {
  EXPECT_EQ(*CheckpointFolderName("jobs/12"), "job-12");
  EXPECT_EQ(*CheckpointFolderName("jobs/7"), "job-7");
  const std::vector<std::string> refused = {
      "", ".", "..", "jobs/../x", "../x", "jobs/1/../..", "a/b", "/etc", std::string("jobs/1\0x", 8),
      std::string(300, 'j')};
  for (const std::string& job : refused) {
    SCOPED_TRACE(job);
    absl::StatusOr<std::string> folder = CheckpointFolderName(job);
    EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(folder.status().message(), HasSubstr("cannot name a checkpoint folder"));
  }
}

TEST_F(PathConfinementTest, AJobFolderIsUnderTheRootAsGiven) {
  EXPECT_EQ(*JobCheckpointDir(T("ckpt"), "jobs/3", tmp_), T("ckpt") + "/job-3");
  EXPECT_EQ(*JobCheckpointDir("ckpt", "jobs/3", tmp_ / "cwd"), "ckpt/job-3");
  EXPECT_EQ(JobCheckpointDir(T("ckpt"), "jobs/../../etc", tmp_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A job folder that is a symlink out of the root is refused.
  fs::create_directories(tmp_ / "ckpt");
  fs::create_directory_symlink(tmp_ / "elsewhere", tmp_ / "ckpt/job-4");
  absl::StatusOr<std::string> out = JobCheckpointDir(T("ckpt"), "jobs/4", tmp_);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(out.status().message(), HasSubstr("outside the worker's checkpoint root"));
  // So is one that is a symlink inside it (into another job's folder).
  fs::create_directories(tmp_ / "ckpt/job-5");
  fs::create_directory_symlink(tmp_ / "ckpt/job-5", tmp_ / "ckpt/job-6");
  out = JobCheckpointDir(T("ckpt"), "jobs/6", tmp_);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr(T("ckpt") + "/job-6 is a symlink"), HasSubstr("remove the link")));
  EXPECT_TRUE(JobCheckpointDir(T("ckpt"), "jobs/5", tmp_).ok());
}

TEST_F(PathConfinementTest, AResumePathMustResolveInsideTheJobsFolder) {
  fs::create_directories(tmp_ / "ckpt/job-1");
  fs::create_directories(tmp_ / "ckpt/job-2");
  Touch(T("ckpt/job-1/step-00000010.ckpt"));
  Touch(T("ckpt/job-2/step-00000010.ckpt"));
  Touch(T("elsewhere/forged.ckpt"));
  const std::string dir = T("ckpt") + "/job-1";
  auto check = [&](const std::string& path) {
    return CheckResumePath(path, dir, T("ckpt"), tmp_ / "cwd");
  };
  EXPECT_TRUE(check(T("ckpt/job-1/step-00000010.ckpt")).ok());
  EXPECT_TRUE(check("../ckpt/job-1/step-00000010.ckpt").ok());  // relative to the cwd
  for (const std::string& bad : std::vector<std::string>{
           T("ckpt/job-2/step-00000010.ckpt"), T("elsewhere/forged.ckpt"),
        T("ckpt/job-1/../job-2/step-00000010.ckpt"), T("ckpt/job-1"), "/etc/passwd"}) {
    SCOPED_TRACE(bad);
    absl::Status s = check(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("resume_from.path \"" + bad + "\""),
                                   HasSubstr("outside this job's checkpoint folder " +
                                             T("ckpt/job-1")),
                                   HasSubstr(T("ckpt") + " (--checkpoint_dir)")));
  }
  // A symlink inside the job's folder that leads out of it.
  fs::create_symlink(tmp_ / "elsewhere/forged.ckpt", tmp_ / "ckpt/job-1/step-00000020.ckpt");
  EXPECT_EQ(check(T("ckpt/job-1/step-00000020.ckpt")).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(PathConfinementTest, AResumePathThroughASymlinkedRootIsTheSameFolder) {
  fs::create_directories(tmp_ / "real-ckpt/job-1");
  Touch(T("real-ckpt/job-1/step-00000010.ckpt"));
  fs::create_directory_symlink(tmp_ / "real-ckpt", tmp_ / "ckpt");
  EXPECT_TRUE(CheckResumePath(T("real-ckpt/job-1/step-00000010.ckpt"), T("ckpt") + "/job-1",
                              T("ckpt"), tmp_)
                  .ok());
}

}  // namespace
}  // namespace tally::worker
