// Fuzzes ReadCheckpoint (worker/train/checkpoint.h): what a worker does with
// the checkpoint file it resumes from.
//
// The file ends in the SHA-256 of its contents, which random bytes never
// match; so by default the target appends the right digest to the input and
// the parser behind the checksum is what gets fuzzed. Input: byte 0 is a
// flags byte (bit 0: write the rest as is, digest included; bit 1: pass the
// file's digest as expected_sha256), the rest is the file's contents.
//
// A checkpoint that reads must write back (WriteCheckpoint) and read again
// to the same metadata and tensor bytes.
#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "fuzz/scratch_dir.h"
#include "worker/train/checkpoint.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

std::string Sha256(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string Bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

void CheckSame(const tally::train::CheckpointData& a, const tally::train::CheckpointData& b) {
  if (a.metadata_json != b.metadata_json) Fail("metadata changed in a write/read round trip");
  if (a.tensors.size() != b.tensors.size()) Fail("tensor count changed in a round trip");
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name_a, ta] = a.tensors[i];
    const auto& [name_b, tb] = b.tensors[i];
    if (name_a != name_b || ta.scalar_type() != tb.scalar_type() ||
        ta.sizes() != tb.sizes() || Bytes(ta) != Bytes(tb)) {
      Fail("tensor " + name_a + " changed in a write/read round trip");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!(flags & 1)) file += Sha256(file);
  std::string expected;
  if ((flags & 2) && file.size() >= 32) {
    expected = absl::BytesToHexString(Sha256(file.substr(0, file.size() - 32)));
  }
  const std::string path = tally::fuzz::ScratchDir() + "/ckpt";
  tally::fuzz::WriteFileOrDie(path, file);

  absl::StatusOr<tally::train::CheckpointData> read = tally::train::ReadCheckpoint(path, expected);
  if (!read.ok()) {
    if (read.status().code() != absl::StatusCode::kDataLoss || read.status().message().empty()) {
      Fail("a bad checkpoint is not DATA_LOSS with a message: " + read.status().ToString());
    }
    return 0;
  }
  for (const auto& [name, t] : read->tensors) {
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
      Fail("tensor " + name + " is not a defined contiguous CPU tensor");
    }
  }
  const std::string copy = tally::fuzz::ScratchDir() + "/ckpt2";
  absl::StatusOr<std::string> sha = tally::train::WriteCheckpoint(copy, *read);
  if (!sha.ok()) Fail("writing back a checkpoint that read: " + sha.status().ToString());
  absl::StatusOr<tally::train::CheckpointData> again = tally::train::ReadCheckpoint(copy, *sha);
  if (!again.ok()) Fail("reading back a written checkpoint: " + again.status().ToString());
  CheckSame(*read, *again);
  return 0;
}
