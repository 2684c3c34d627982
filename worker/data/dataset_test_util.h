// For the dataset tests: a fresh temporary folder's PREFIX, and a file's
// bytes.
#ifndef TALLY_WORKER_DATA_DATASET_TEST_UTIL_H_
#define TALLY_WORKER_DATA_DATASET_TEST_UTIL_H_

#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace tally::data {

// DIR/`name` for a new /tmp/tally_data_* folder DIR.
inline std::string TempPrefix(const std::string& name) {
  char dir[] = "/tmp/tally_data_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return std::string(dir) + "/" + name;
}

// The file's bytes; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_DATASET_TEST_UTIL_H_
