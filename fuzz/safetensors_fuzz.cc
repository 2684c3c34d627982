// Fuzzes ReadSafetensors (worker/model/safetensors.h): what model.init_from
// and tally-forward do with a Hugging Face folder's model.safetensors.
//
// Input: the file's bytes. A file that reads must hold FP32 CPU tensors of
// its header's shapes, write back (WriteSafetensors, F32) and read again to
// the same names, shapes and bytes. A file that does not read fails with
// DATA_LOSS or INVALID_ARGUMENT and a message, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/scratch_dir.h"
#include "worker/model/safetensors.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

std::string Bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tally::fuzz::ScratchDir() + "/model.safetensors";
  tally::fuzz::WriteFileOrDie(path, std::string(reinterpret_cast<const char*>(data), size));
  auto read = tally::model::ReadSafetensors(path);
  if (!read.ok()) {
    const auto code = read.status().code();
    if ((code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument) ||
        read.status().message().empty()) {
      Fail("a bad file is not DATA_LOSS or INVALID_ARGUMENT with a message: " +
           read.status().ToString());
    }
    return 0;
  }
  for (const auto& [name, t] : *read) {
    if (!t.defined() || t.scalar_type() != at::kFloat || !t.device().is_cpu()) {
      Fail("tensor " + name + " is not a defined FP32 CPU tensor");
    }
  }
  const std::string copy = tally::fuzz::ScratchDir() + "/copy.safetensors";
  if (auto s = tally::model::WriteSafetensors(copy, *read, at::kFloat); !s.ok()) {
    Fail("writing back a file that read: " + s.ToString());
  }
  auto again = tally::model::ReadSafetensors(copy);
  if (!again.ok()) Fail("reading back a written file: " + again.status().ToString());
  if (again->size() != read->size()) Fail("tensor count changed in a round trip");
  for (size_t i = 0; i < read->size(); ++i) {
    const auto& [a, ta] = (*read)[i];
    const auto& [b, tb] = (*again)[i];
    if (a != b || ta.sizes() != tb.sizes() || Bytes(ta) != Bytes(tb)) {
      Fail("tensor " + a + " changed in a write/read round trip");
    }
  }
  return 0;
}
