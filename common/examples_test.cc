// The files under examples/ are what users copy: every job spec and
// experiment there reads and validates as it is written.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/experiment_spec.h"
#include "common/spec_validation.h"
#include "common/spec_yaml.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ExamplesTest, EveryJobSpecValidates) {
  int seen = 0;
  for (const auto& f :
       std::filesystem::directory_iterator(std::string(TALLY_SOURCE_DIR) + "/examples/jobs")) {
    if (f.path().extension() != ".yaml") continue;
    ++seen;
    auto spec = ReadJobSpecFile(f.path().string());
    ASSERT_TRUE(spec.ok()) << f.path() << ": " << spec.status();
    EXPECT_TRUE(PrepareJobSpec(&*spec).ok()) << f.path() << ": " << PrepareJobSpec(&*spec);
  }
  EXPECT_GE(seen, 5);
}

TEST(ExamplesTest, EveryExperimentValidates) {
  int seen = 0;
  for (const auto& f : std::filesystem::directory_iterator(std::string(TALLY_SOURCE_DIR) +
                                                           "/examples/experiments")) {
    if (f.path().extension() != ".yaml") continue;
    ++seen;
    auto spec = ParseExperimentYaml(Read(f.path()), f.path().string());
    ASSERT_TRUE(spec.ok()) << f.path() << ": " << spec.status();
    ApplyExperimentDefaults(&*spec);
    EXPECT_TRUE(ValidateExperimentSpec(*spec).ok())
        << f.path() << ": " << ValidateExperimentSpec(*spec);
  }
  EXPECT_GE(seen, 3);
}

}  // namespace
}  // namespace tally
