// dataset_check_bench: how fast a dataset is checked. Writes (or takes) a
// dataset of --gb gigabytes of tokens, then times, from the page cache:
//   open:   Dataset::Open, the checks every training start pays (metadata,
//           index structure, the vectorised token-id range check);
//   range:  MaxTokenId alone over the already-mapped tokens;
//   verify: Dataset::VerifyContentHash, the SHA-256 `tally-prep verify` adds.
// Cold-cache numbers are the disk's; drop the page cache to measure them.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "worker/data/dataset.h"

ABSL_FLAG(double, gb, 1.0, "gigabytes of tokens to generate when --prefix is empty");
ABSL_FLAG(std::string, prefix, "", "an existing dataset prefix to measure instead");
ABSL_FLAG(std::string, dir, "/tmp", "where the generated dataset is written");
ABSL_FLAG(int, repeats, 3, "timed runs of each check; the best is reported");

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string Generate(double gb) {
  const std::string prefix = absl::GetFlag(FLAGS_dir) + "/dataset_check_bench";
  auto w = tally::data::DatasetWriter::Create(prefix);
  if (!w.ok()) {
    std::cerr << w.status() << "\n";
    std::exit(1);
  }
  const int64_t target_tokens = static_cast<int64_t>(gb * 1e9 / 2);
  std::mt19937_64 rng(1);
  std::vector<uint16_t> doc;
  while ((*w)->num_tokens() < target_tokens) {
    doc.resize(1 + rng() % 4096);
    for (uint16_t& t : doc) t = static_cast<uint16_t>(rng() % 258);
    if (auto s = (*w)->Add(doc); !s.ok()) {
      std::cerr << s << "\n";
      std::exit(1);
    }
  }
  if (auto s = (*w)->Finish("{}"); !s.ok()) {
    std::cerr << s << "\n";
    std::exit(1);
  }
  return prefix;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string prefix = absl::GetFlag(FLAGS_prefix);
  const bool generated = prefix.empty();
  if (generated) prefix = Generate(absl::GetFlag(FLAGS_gb));
  double open_s = 1e30, range_s = 1e30, verify_s = 1e30;
  int64_t bin_bytes = 0, idx_bytes = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    auto start = std::chrono::steady_clock::now();
    auto ds = tally::data::Dataset::Open(prefix);
    if (!ds.ok()) {
      std::cerr << ds.status() << "\n";
      return 1;
    }
    open_s = std::min(open_s, Seconds(start));
    bin_bytes = (*ds)->bin_bytes();
    idx_bytes = (*ds)->idx_bytes();
    start = std::chrono::steady_clock::now();
    const size_t n = static_cast<size_t>((*ds)->num_tokens());
    const int64_t max_id =
        (*ds)->metadata().token_bytes == 4
            ? tally::data::MaxTokenId(static_cast<const uint32_t*>((*ds)->token_data()), n)
            : tally::data::MaxTokenId(static_cast<const uint16_t*>((*ds)->token_data()), n);
    range_s = std::min(range_s, Seconds(start));
    if (max_id >= (*ds)->metadata().vocab_size) return 1;
    start = std::chrono::steady_clock::now();
    if (auto s = (*ds)->VerifyContentHash(); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    verify_s = std::min(verify_s, Seconds(start));
  }
  const double gb = (bin_bytes + idx_bytes) / 1e9;
  const double bin_gb = bin_bytes / 1e9;
  std::printf("dataset %s: .bin %.3f GB, .idx %.3f GB\n", prefix.c_str(), bin_gb, idx_bytes / 1e9);
  std::printf("open   (metadata + index + range check) %8.3f s  %6.2f GB/s of .bin+.idx\n", open_s,
              gb / open_s);
  std::printf("range  (MaxTokenId, mapped)             %8.3f s  %6.2f GB/s of .bin\n", range_s,
              bin_gb / range_s);
  std::printf("verify (SHA-256 of .bin and .idx)       %8.3f s  %6.2f GB/s\n", verify_s,
              gb / verify_s);
  if (generated) {
    for (const char* ext : {".bin", ".idx", ".json"}) std::remove((prefix + ext).c_str());
  }
  return 0;
}
