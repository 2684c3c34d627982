// tally-forward: the logits Tally's own model computes (FP32, CPU) for
// token sequences, from a Tally checkpoint or a Hugging Face folder, as
// JSON: {"logits": [[[float, ...vocab], ...positions], ...sequences]}.
// For checking an export against another implementation, and for scoring.
//
//   tally-forward --checkpoint=FILE --tokens='256,72,105;256,10'
//   tally-forward --hf=DIR --tokens=...
#include <ATen/core/grad_mode.h>

#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/model/transformer.h"
#include "worker/train/model_io.h"

ABSL_FLAG(std::string, checkpoint, "", "a Tally checkpoint");
ABSL_FLAG(std::string, hf, "", "a Hugging Face model folder (config.json + model.safetensors)");
ABSL_FLAG(std::string, tokens, "",
          "token ids, comma-separated; sequences separated by ';' (\"256,72,105;256,10\")");

namespace {
int Fail(const std::string& message, int code = 1) {
  std::cerr << "tally-forward: " << message << "\n";
  return code;
}
}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-forward: Tally's logits for token sequences, as JSON.\n\nUsage: tally-forward "
      "--checkpoint=FILE|--hf=DIR --tokens='ID,ID,...[;ID,...]'");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument ", rest[1]), 2);
  std::vector<std::vector<int64_t>> seqs;
  for (absl::string_view seq :
       absl::StrSplit(absl::GetFlag(FLAGS_tokens), ';', absl::SkipWhitespace())) {
    std::vector<int64_t> ids;
    for (absl::string_view t : absl::StrSplit(seq, ',', absl::SkipWhitespace())) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(t, &id)) {
        return Fail(absl::StrCat("--tokens: \"", t, "\" is not a token id"), 2);
      }
      ids.push_back(id);
    }
    if (ids.empty()) return Fail("--tokens: an empty sequence", 2);
    seqs.push_back(std::move(ids));
  }
  if (seqs.empty()) return Fail("give --tokens='ID,ID,...[;ID,...]'", 2);
  const std::string ckpt = absl::GetFlag(FLAGS_checkpoint), hf = absl::GetFlag(FLAGS_hf);
  if (ckpt.empty() == hf.empty()) return Fail("give --checkpoint=FILE or --hf=DIR", 2);
  auto w = tally::train::ReadInitialWeights(hf, ckpt);
  if (!w.ok()) return Fail(std::string(w.status().message()));
  tally::model::Transformer model(w->config, 0, at::kCPU);
  {
    at::NoGradGuard no_grad;
    for (auto& p : model.parameters()) {
      auto it = w->parameters.find(p.name);
      if (it == w->parameters.end() || it->second.sizes() != p.value.sizes()) {
        return Fail(absl::StrCat(w->source, ": no weights of the model's shape for ", p.name));
      }
      p.value.copy_(it->second);
    }
    for (auto& [layer, bias] : model.expert_biases()) {
      auto it = w->biases.find(layer);
      if (it != w->biases.end() && it->second.sizes() == bias.sizes()) bias.copy_(it->second);
    }
  }
  at::NoGradGuard no_grad;
  std::cout << std::setprecision(9) << "{\"logits\": [";
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t T = static_cast<int64_t>(seqs[s].size());
    for (int64_t id : seqs[s]) {
      if (id < 0 || id >= w->config.vocab_size) {
        return Fail(absl::StrCat("--tokens: id ", id, " is outside the vocabulary (",
                                 w->config.vocab_size, ")"),
                    2);
      }
    }
    tally::model::ModelInput in;
    in.tokens_BT = at::tensor(seqs[s], at::kLong).view({1, T});
    in.positions_BT = at::arange(T, at::kLong).view({1, T});
    in.segments_BT = at::zeros({1, T}, at::kLong);
    const at::Tensor logits =
        model.Forward(in, tally::model::AttentionKernel::kMaskedSdpa).to(at::kFloat)[0];
    std::cout << (s ? ", " : "") << "[";
    const float* v = logits.contiguous().data_ptr<float>();
    const int64_t V = logits.size(1);
    for (int64_t t = 0; t < T; ++t) {
      std::cout << (t ? ", " : "") << "[";
      for (int64_t i = 0; i < V; ++i) std::cout << (i ? ", " : "") << v[t * V + i];
      std::cout << "]";
    }
    std::cout << "]";
  }
  std::cout << "]}\n";
  return 0;
}
