#include "server/ha/dsn.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::ha {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempFile(const std::string& text) {
  char path[] = "/tmp/tally_dsn_XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ResolveDsnTest, FlagWinsOverEnvironment) {
  auto dsn = ResolveDsn({.flag = "host=a", .file_flag = "", .env = "host=b"});
  ASSERT_TRUE(dsn.ok());
  EXPECT_EQ(*dsn, "host=a");
}

TEST(ResolveDsnTest, EnvironmentWhenNoFlag) {
  auto dsn = ResolveDsn({.flag = "", .file_flag = "", .env = "host=b"});
  ASSERT_TRUE(dsn.ok());
  EXPECT_EQ(*dsn, "host=b");
}

TEST(ResolveDsnTest, FileIsTrimmedAndWinsOverEnvironment) {
  const std::string path = TempFile("host=db password=s3cret\n\n");
  auto dsn = ResolveDsn({.flag = "", .file_flag = path, .env = "host=b"});
  ASSERT_TRUE(dsn.ok());
  EXPECT_EQ(*dsn, "host=db password=s3cret");
  std::remove(path.c_str());
}

TEST(ResolveDsnTest, NoneNamesAllThreeWays) {
  auto dsn = ResolveDsn({});
  ASSERT_FALSE(dsn.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(dsn.status()));
  EXPECT_THAT(dsn.status().message(), HasSubstr("--postgres_dsn="));
  EXPECT_THAT(dsn.status().message(), HasSubstr("$TALLY_POSTGRES_DSN"));
  EXPECT_THAT(dsn.status().message(), HasSubstr("--postgres_dsn_file="));
}

TEST(ResolveDsnTest, BothFlagsRefused) {
  auto dsn = ResolveDsn({.flag = "host=a", .file_flag = "/x", .env = ""});
  EXPECT_TRUE(absl::IsInvalidArgument(dsn.status()));
}

TEST(ResolveDsnTest, UnparsableIsRefusedNamingWhereItCameFromNeverItsPassword) {
  auto flag = ResolveDsn({.flag = "host=db port", .file_flag = "", .env = ""});
  ASSERT_TRUE(absl::IsInvalidArgument(flag.status()));
  EXPECT_THAT(flag.status().message(), HasSubstr("--postgres_dsn:"));
  EXPECT_THAT(flag.status().message(), HasSubstr("port"));
  auto env = ResolveDsn({.flag = "", .file_flag = "", .env = "password=hunter2 bogus=1"});
  ASSERT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("$TALLY_POSTGRES_DSN"));
  EXPECT_THAT(env.status().message(), HasSubstr("bogus"));
  EXPECT_THAT(env.status().message(), Not(HasSubstr("hunter2")));
  auto uri = ResolveDsn({.flag = "postgresql://tally@[db:5432/tally", .file_flag = "", .env = ""});
  EXPECT_TRUE(absl::IsInvalidArgument(uri.status()));
  EXPECT_TRUE(ResolveDsn({.flag = "postgresql://tally@db:5432/tally", .file_flag = "", .env = ""})
                  .ok());
}

TEST(ResolveDsnTest, MissingOrEmptyFileNamesIt) {
  auto missing = ResolveDsn({.flag = "", .file_flag = "/nonexistent/dsn", .env = ""});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/dsn"));
  const std::string path = TempFile(" \n");
  auto empty = ResolveDsn({.flag = "", .file_flag = path, .env = ""});
  EXPECT_TRUE(absl::IsFailedPrecondition(empty.status()));
  EXPECT_THAT(empty.status().message(), HasSubstr(path));
  std::remove(path.c_str());
  auto folder = ResolveDsn({.flag = "", .file_flag = "/tmp", .env = ""});
  EXPECT_TRUE(absl::IsFailedPrecondition(folder.status()));
  EXPECT_THAT(folder.status().message(), HasSubstr("is a folder"));
  auto endless = ResolveDsn({.flag = "", .file_flag = "/dev/zero", .env = ""});
  EXPECT_TRUE(absl::IsFailedPrecondition(endless.status()));
  EXPECT_THAT(endless.status().message(), HasSubstr("more than 65536 bytes"));
}

TEST(RedactDsnTest, KeywordFormDropsThePassword) {
  const std::string shown = RedactDsn("host=db port=5433 dbname=tally user=t password=s3cret");
  EXPECT_EQ(shown, "host=db port=5433 dbname=tally user=t");
}

TEST(RedactDsnTest, UriFormDropsThePassword) {
  const std::string shown = RedactDsn("postgresql://t:s3cret@db:5433/tally?sslmode=require");
  EXPECT_THAT(shown, Not(HasSubstr("s3cret")));
  EXPECT_THAT(shown, HasSubstr("host=db"));
  EXPECT_THAT(shown, HasSubstr("dbname=tally"));
  EXPECT_THAT(shown, HasSubstr("sslmode=require"));
}

TEST(RedactDsnTest, UnparsableIsNeverEchoed) {
  const std::string shown = RedactDsn("host=db password='s3cret");
  EXPECT_THAT(shown, Not(HasSubstr("s3cret")));
}

}  // namespace
}  // namespace tally::ha
