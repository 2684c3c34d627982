// tally-export: a Tally checkpoint as a Hugging Face model folder
// (config.json, model.safetensors, generation_config.json, tokenizer files)
// that transformers' LlamaForCausalLM / MixtralForCausalLM and vLLM load.
//
//   tally-export --checkpoint=FILE --out=DIR [--dtype=fp32|bf16]
//   tally-export --job=jobs/N [--which=best|latest] --out=DIR
//
// --job reads tallyd's checkpoint records through tallyctl (`tallyctl
// checkpoints JOB --output=json`, found beside this program or on PATH), so
// the connection, TLS and token settings are tallyctl's own; the record's
// SHA-256 is checked against the file.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/train/model_io.h"

ABSL_FLAG(std::string, checkpoint, "", "the Tally checkpoint file to export");
ABSL_FLAG(std::string, job, "",
          "export a job's checkpoint instead, by name (jobs/N), from tallyd's records");
ABSL_FLAG(std::string, which, "best",
          "with --job: best (lowest validation loss; the latest when none was evaluated) or "
          "latest");
ABSL_FLAG(std::string, controller, "",
          "with --job: tallyd's address, passed to tallyctl (default: tallyctl's own)");
ABSL_FLAG(std::string, format, "hf", "output format: hf (a Hugging Face model folder)");
ABSL_FLAG(std::string, out, "", "the folder to write (created if missing)");
ABSL_FLAG(std::string, dtype, "fp32",
          "weights as written: fp32 (as trained, exact) or bf16 (half the size)");
ABSL_FLAG(std::string, tokenizer_model, "",
          "a SentencePiece-trained model: its tokenizer.model, when no longer where the "
          "dataset recorded it (checked against the recorded SHA-256)");
ABSL_FLAG(bool, drop_routing_bias, false,
          "MoE: export even when the experts' balancing biases are non-zero (the exported "
          "model then routes some tokens differently from Tally)");

namespace {

// A record's number: protobuf's JSON prints 64-bit integers as strings.
double Num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number()) return it->get<double>();
  double v = 0;
  if (it->is_string() && absl::SimpleAtod(it->get<std::string>(), &v)) return v;
  return 0;
}

std::string Str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int Fail(const std::string& message, int code = 1) {
  std::cerr << "tally-export: " << message << "\n";
  return code;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// tallyctl beside this program, else on PATH.
std::string Tallyctl(const char* argv0) {
  std::error_code ec;
  const auto self = std::filesystem::canonical("/proc/self/exe", ec);
  for (const auto& dir : {self.parent_path(), self.parent_path().parent_path() / "cli"}) {
    if (!ec && ::access((dir / "tallyctl").c_str(), X_OK) == 0) return (dir / "tallyctl").string();
  }
  (void)argv0;
  return "tallyctl";
}

// The checkpoint record --job and --which pick, through tallyctl.
absl::StatusOr<std::pair<std::string, std::string>> FromJob(const std::string& job,
                                                            const std::string& which,
                                                            const char* argv0) {
  std::string cmd = Quote(Tallyctl(argv0)) + " checkpoints " + Quote(job) + " --output=json";
  if (!absl::GetFlag(FLAGS_controller).empty()) {
    cmd += " --controller=" + Quote(absl::GetFlag(FLAGS_controller));
  }
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError("cannot run tallyctl");
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0 && text.size() < (64 << 20)) {
    text.append(buf.data(), n);
  }
  const int rc = ::pclose(p);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "tallyctl checkpoints ", job, " failed (its message is above); check --controller"));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError("tallyctl printed something other than JSON");
  }
  const nlohmann::json list =
      j.contains("checkpoints") ? j["checkpoints"] : nlohmann::json::array();
  if (!list.is_array() || list.empty()) {
    return absl::NotFoundError(absl::StrCat(job, " has no checkpoints yet"));
  }
  const nlohmann::json* pick = nullptr;
  for (const auto& ck : list) {
    if (!ck.is_object()) continue;
    const double v = Num(ck, "val_loss");
    if (which == "latest") {
      if (pick == nullptr || Num(ck, "step") >= Num(*pick, "step")) pick = &ck;
    } else if (v != 0 && (pick == nullptr || v < Num(*pick, "val_loss"))) {
      pick = &ck;
    }
  }
  if (pick == nullptr) {  // best, with no evaluated checkpoint: the latest
    for (const auto& ck : list) {
      if (ck.is_object() && (pick == nullptr || Num(ck, "step") >= Num(*pick, "step"))) {
        pick = &ck;
      }
    }
  }
  if (pick == nullptr || Str(*pick, "path").empty()) {
    return absl::NotFoundError(absl::StrCat(job, ": no checkpoint record with a path"));
  }
  std::cerr << "tally-export: " << job << " " << which << " checkpoint: step " << Num(*pick, "step")
            << ", val loss " << Num(*pick, "val_loss") << ", " << Str(*pick, "path") << "\n";
  return std::make_pair(Str(*pick, "path"), Str(*pick, "sha256"));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-export: a Tally checkpoint as a Hugging Face model folder.\n\nUsage:\n"
      "  tally-export --checkpoint=FILE --out=DIR [--dtype=fp32|bf16]\n"
      "  tally-export --job=jobs/N [--which=best|latest] --out=DIR\n"
      "Writes config.json (LlamaForCausalLM, or MixtralForCausalLM for a softmax-routed MoE), "
      "model.safetensors, generation_config.json and the tokenizer. Exit 0 written, 1 "
      "refused or failed, 2 usage.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument ", rest[1]), 2);
  if (absl::GetFlag(FLAGS_format) != "hf") {
    return Fail("--format: only hf (a Hugging Face model folder) is written", 2);
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail("--out is required: the folder to write", 2);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "fp32" && dtype != "bf16") {
    return Fail("--dtype: must be fp32 or bf16, got \"" + dtype + "\"", 2);
  }
  std::string path = absl::GetFlag(FLAGS_checkpoint), sha;
  const std::string job = absl::GetFlag(FLAGS_job), which = absl::GetFlag(FLAGS_which);
  if (path.empty() == job.empty()) {
    return Fail("give --checkpoint=FILE or --job=jobs/N (one of them)", 2);
  }
  if (which != "best" && which != "latest") {
    return Fail("--which: must be best or latest, got \"" + which + "\"", 2);
  }
  if (!job.empty()) {
    auto picked = FromJob(job, which, argv[0]);
    if (!picked.ok()) return Fail(std::string(picked.status().message()));
    path = picked->first;
    sha = picked->second;
  }
  auto model = tally::train::ReadCheckpointModel(path, sha);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  tally::model::HfExportOptions options;
  options.dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  options.drop_routing_bias = absl::GetFlag(FLAGS_drop_routing_bias);
  options.tokenizer_model = absl::GetFlag(FLAGS_tokenizer_model);
  auto summary = tally::train::ExportHf(*model, out, options);
  if (!summary.ok()) return Fail(std::string(summary.status().message()));
  std::cout << absl::StrFormat(
      "tally-export: %s (step %d) -> %s: %s, %d tensors, %d parameters, %s, %.1f MB\n", path,
      model->step, out, summary->architecture, summary->tensors, summary->parameters, dtype,
      static_cast<double>(summary->bytes) / 1e6);
  return 0;
}
