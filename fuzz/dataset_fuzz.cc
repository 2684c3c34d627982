// Fuzzes Dataset::Open (worker/data/dataset.h), the trainer's reader of
// tally-prep's output, on arbitrary .idx/.bin/.json files.
//
// Input framing: uint16 idx_len, uint16 json_len (little-endian, each clamped
// to what is left), then idx_len bytes of PREFIX.idx, json_len bytes of
// PREFIX.json, and the rest is PREFIX.bin. Mapped files are outside what
// AddressSanitizer sees, so an opened dataset is checked against the file
// sizes: every offset it will hand out lies inside the files it mapped, and
// every token is inside the vocabulary. VerifyContentHash runs on every
// dataset that opens.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fuzz/scratch_dir.h"
#include "worker/data/dataset.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "dataset_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

constexpr size_t kIdxHeaderBytes = 24;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size - 4;
  const size_t idx_len = std::min<size_t>(data[0] | data[1] << 8, left);
  left -= idx_len;
  const size_t json_len = std::min<size_t>(data[2] | data[3] << 8, left);
  left -= json_len;
  const std::string idx(p + 4, idx_len);
  const std::string json(p + 4 + idx_len, json_len);
  const std::string bin(p + 4 + idx_len + json_len, left);

  const std::string prefix = tally::fuzz::ScratchDir() + "/train";
  tally::fuzz::WriteFileOrDie(prefix + ".idx", idx);
  tally::fuzz::WriteFileOrDie(prefix + ".json", json);
  tally::fuzz::WriteFileOrDie(prefix + ".bin", bin);

  absl::StatusOr<std::unique_ptr<tally::data::Dataset>> d =
      tally::data::Dataset::Open(prefix);
  if (!d.ok()) {
    // DataLoss: damaged or inconsistent files; InvalidArgument: well-formed
    // but not readable by this build. Anything else (Internal: an I/O error)
    // cannot come from the files' contents.
    const absl::StatusCode code = d.status().code();
    if ((code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument) ||
        d.status().message().empty()) {
      Fail("a bad dataset is not DATA_LOSS or INVALID_ARGUMENT with a message: " +
           d.status().ToString());
    }
    return 0;
  }
  const tally::data::Dataset& ds = **d;
  // The index must hold num_docs + 1 offsets: checked before reading any.
  if (ds.num_docs() < 0 || idx.size() < kIdxHeaderBytes ||
      static_cast<uint64_t>(ds.num_docs()) + 1 > (idx.size() - kIdxHeaderBytes) / 8) {
    Fail(absl::StrCat("num_docs ", ds.num_docs(), " does not fit a ", idx.size(),
                      "-byte index"));
  }
  if (static_cast<uint64_t>(ds.num_tokens()) * 2 != bin.size()) {
    Fail(absl::StrCat(ds.num_tokens(), " tokens in a ", bin.size(), "-byte .bin"));
  }
  int64_t total = 0;
  uint64_t checksum = 0;
  for (int64_t i = 0; i < ds.num_docs(); ++i) {
    const int64_t len = ds.doc_length(i);
    if (len <= 0 || len > ds.num_tokens() - total) {
      Fail(absl::StrCat("document ", i, " has length ", len));
    }
    for (int64_t t = 0; t < len; ++t) {
      const uint32_t tok = ds.token(i, t);
      if (tok >= ds.metadata().vocab_size) {
        Fail(absl::StrCat("document ", i, " has token ", tok, " outside the vocabulary of ",
                          ds.metadata().vocab_size));
      }
      checksum += tok;
    }
    total += len;
  }
  if (total != ds.num_tokens()) Fail("document lengths do not add up to num_tokens");
  if (static_cast<int64_t>(ds.DocLengths().size()) != ds.num_docs()) {
    Fail("DocLengths() has the wrong size");
  }
  const absl::Status verified = ds.VerifyContentHash();
  if (!verified.ok() && verified.code() != absl::StatusCode::kDataLoss &&
      verified.code() != absl::StatusCode::kFailedPrecondition) {
    Fail("VerifyContentHash: " + verified.ToString());
  }
  volatile uint64_t sink = checksum;
  (void)sink;
  return 0;
}
