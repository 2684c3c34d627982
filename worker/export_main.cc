// tally-export: a Tally checkpoint as a Hugging Face model folder
// (config.json, model.safetensors, generation_config.json, tokenizer files)
// that transformers' LlamaForCausalLM / MixtralForCausalLM and vLLM load, or
// as one GGUF file of llama.cpp's llama architecture (model/gguf.h), which
// llama.cpp, llama-cpp-python, Ollama and LM Studio load.
//
//   tally-export --checkpoint=FILE --out=DIR [--dtype=fp32|bf16]
//   tally-export --checkpoint=FILE --format=gguf [--quant=f16|q8_0|q4_0]
//                [--quant_layers=ffn|all_linear] --out=FILE.gguf
//   tally-export --job=jobs/N [--which=best|latest] [--format=...] --out=...
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
#include <optional>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/ggml_quant.h"
#include "worker/model/gguf.h"
#include "worker/train/model_io.h"

ABSL_FLAG(std::string, checkpoint, "", "the Tally checkpoint file to export");
ABSL_FLAG(std::string, job, "",
          "export a job's checkpoint instead, by name (jobs/N), from tallyd's records");
ABSL_FLAG(std::string, which, "best",
          "with --job: best (lowest validation loss; the latest when none was evaluated) or "
          "latest");
ABSL_FLAG(std::string, controller, "",
          "with --job: tallyd's address, passed to tallyctl (default: tallyctl's own)");
ABSL_FLAG(std::string, format, "hf",
          "output format: hf (a Hugging Face model folder) or gguf (one llama.cpp file)");
ABSL_FLAG(std::string, out, "",
          "hf: the folder to write (created if missing); gguf: the file, ending in .gguf");
ABSL_FLAG(std::string, dtype, "",
          "hf: weights as written: fp32 (as trained, exact; the default) or bf16 (half the "
          "size)");
ABSL_FLAG(std::string, quant, "",
          "gguf: f16 (every matrix F16; the default), q8_0 or q4_0 (the --quant_layers linears "
          "in llama.cpp's block format, bit for bit what quantization-aware training computed "
          "with; the rest F16)");
ABSL_FLAG(std::string, quant_layers, "",
          "gguf with --quant=q8_0|q4_0: ffn (the feed-forward linears; the default) or "
          "all_linear (and attention's); never the embedding, norms, router or head");
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

// `tallyctl ARGS --output=json`'s object.
absl::StatusOr<nlohmann::json> TallyctlJson(const std::string& args, const std::string& what,
                                            const char* argv0) {
  std::string cmd = Quote(Tallyctl(argv0)) + " " + args + " --output=json";
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
        "tallyctl ", what, " failed (its message is above); check --controller"));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError("tallyctl printed something other than JSON");
  }
  return j;
}

// The checkpoint record --job and --which pick, through tallyctl: the
// latest, or the best as tallyctl checkpoints marks it (the lowest loss of
// the metric the job is judged by, never one a worker found damaged).
absl::StatusOr<std::pair<std::string, std::string>> FromJob(const std::string& job,
                                                            const std::string& which,
                                                            const char* argv0) {
  ASSIGN_OR_RETURN(const nlohmann::json j,
                   TallyctlJson("checkpoints " + Quote(job), "checkpoints " + job, argv0));
  const nlohmann::json list =
      j.contains("checkpoints") ? j["checkpoints"] : nlohmann::json::array();
  if (!list.is_array() || list.empty()) {
    return absl::NotFoundError(absl::StrCat(job, " has no checkpoints yet"));
  }
  // The job's metric and damaged checkpoints; an older tallyd's job without
  // them: val_loss, none.
  const char* metric = "val_loss";
  std::set<std::string> damaged;
  if (auto got = TallyctlJson("get " + Quote(job), "get " + job, argv0); got.ok()) {
    const nlohmann::json& spec = got->contains("spec") ? (*got)["spec"] : nlohmann::json();
    if (spec.is_object() && spec.contains("early_stopping") &&
        Str(spec["early_stopping"], "metric") == "quantized_val_loss") {
      metric = "quantized_val_loss";
    }
    if (got->contains("damaged_checkpoints") && (*got)["damaged_checkpoints"].is_array()) {
      for (const auto& d : (*got)["damaged_checkpoints"]) {
        if (d.is_object()) damaged.insert(Str(d, "path"));
      }
    }
  }
  const nlohmann::json* pick = nullptr;
  for (const auto& ck : list) {
    if (!ck.is_object() || damaged.count(Str(ck, "path"))) continue;
    const double v = Num(ck, metric);
    if (which == "latest") {
      if (pick == nullptr || Num(ck, "step") >= Num(*pick, "step")) pick = &ck;
    } else if (v != 0 && (pick == nullptr || v < Num(*pick, metric))) {
      pick = &ck;
    }
  }
  if (pick == nullptr) {  // best, with no evaluated checkpoint: the latest
    for (const auto& ck : list) {
      if (ck.is_object() && !damaged.count(Str(ck, "path")) &&
          (pick == nullptr || Num(ck, "step") >= Num(*pick, "step"))) {
        pick = &ck;
      }
    }
  }
  if (pick == nullptr || Str(*pick, "path").empty()) {
    return absl::NotFoundError(absl::StrCat(job, ": no checkpoint record with a path"));
  }
  std::cerr << "tally-export: " << job << " " << which << " checkpoint: step " << Num(*pick, "step")
            << ", val loss " << Num(*pick, "val_loss");
  if (pick->contains("quantized_val_loss")) {
    std::cerr << ", quantized val loss " << Num(*pick, "quantized_val_loss");
  }
  std::cerr << ", " << Str(*pick, "path") << "\n";
  return std::make_pair(Str(*pick, "path"), Str(*pick, "sha256"));
}

// What the flags ask for, checked.
struct Request {
  std::string format, out, checkpoint, job, which;
  std::string dtype = "fp32";                    // hf
  std::optional<tally::model::GgmlQuant> quant;  // gguf; nullopt: f16
  tally::model::QuantLayers quant_layers = tally::model::QuantLayers::kFfn;
  bool quant_given = false;  // --quant or --quant_layers given: else QAT's own
};

// The usage error, or "" with `r` filled.
std::string ParseRequest(Request* r) {
  r->format = absl::GetFlag(FLAGS_format);
  r->out = absl::GetFlag(FLAGS_out);
  r->checkpoint = absl::GetFlag(FLAGS_checkpoint);
  r->job = absl::GetFlag(FLAGS_job);
  r->which = absl::GetFlag(FLAGS_which);
  const std::string dtype = absl::GetFlag(FLAGS_dtype), quant = absl::GetFlag(FLAGS_quant),
                    layers = absl::GetFlag(FLAGS_quant_layers);
  const bool gguf = r->format == "gguf";
  if (r->format != "hf" && !gguf) {
    return "--format: must be hf (a Hugging Face model folder) or gguf (one llama.cpp file), "
           "got \"" +
           r->format + "\"";
  }
  if (r->out.empty()) {
    return gguf ? "--out is required: the .gguf file to write"
                : "--out is required: the folder to write";
  }
  if (r->checkpoint.empty() == r->job.empty()) {
    return "give --checkpoint=FILE or --job=jobs/N (one of them)";
  }
  if (r->which != "best" && r->which != "latest") {
    return "--which: must be best or latest, got \"" + r->which + "\"";
  }
  if (!gguf) {
    if (!quant.empty() || !layers.empty()) {
      return std::string(quant.empty() ? "--quant_layers" : "--quant") +
             " applies to --format=gguf; a Hugging Face folder holds fp32 or bf16 weights "
             "(--dtype)";
    }
    if (!dtype.empty()) r->dtype = dtype;
    if (r->dtype != "fp32" && r->dtype != "bf16") {
      return "--dtype: must be fp32 or bf16, got \"" + r->dtype + "\"";
    }
    return "";
  }
  if (!absl::EndsWith(r->out, ".gguf") || r->out.size() <= 5) {
    return "--out: with --format=gguf, name the file to write, ending in .gguf (got \"" + r->out +
           "\")";
  }
  if (!dtype.empty()) {
    return "--dtype applies to --format=hf; a GGUF file's weights are --quant=f16, q8_0 or q4_0";
  }
  r->quant_given = !quant.empty() || !layers.empty();
  if (!quant.empty() && quant != "f16") {
    r->quant = tally::model::ParseGgmlQuant(quant);
    if (!r->quant) return "--quant: must be f16, q8_0 or q4_0, got \"" + quant + "\"";
  }
  if (!layers.empty()) {
    if (!r->quant) {
      return "--quant_layers applies to --quant=q8_0 or q4_0 (with f16 every matrix is F16)";
    }
    auto parsed = tally::model::ParseQuantLayers(layers);
    if (!parsed) return "--quant_layers: must be ffn or all_linear, got \"" + layers + "\"";
    r->quant_layers = *parsed;
  }
  return "";
}

int WriteHf(const tally::train::CheckpointModel& m, const Request& r) {
  tally::model::HfExportOptions options;
  options.dtype = r.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  options.drop_routing_bias = absl::GetFlag(FLAGS_drop_routing_bias);
  options.tokenizer_model = absl::GetFlag(FLAGS_tokenizer_model);
  auto summary = tally::train::ExportHf(m, r.out, options);
  if (!summary.ok()) return Fail(std::string(summary.status().message()));
  std::cout << absl::StrFormat(
      "tally-export: %s (step %d) -> %s: %s, %d tensors, %d parameters, %s, %.1f MB\n", m.path,
      m.step, r.out, summary->architecture, summary->tensors, summary->parameters, r.dtype,
      static_cast<double>(summary->bytes) / 1e6);
  return 0;
}

// A model trained for a format (training.qat) is exported in it unless the
// flags say otherwise; then the export's weights are not the ones it was
// trained to compute with, which is said.
void QatDefaults(const tally::train::CheckpointModel& m, Request* r) {
  namespace model = tally::model;
  if (!m.qat) return;
  const std::string trained = model::QuantizationName(*m.qat);
  if (!r->quant_given) {
    r->quant = m.qat->format;
    r->quant_layers = m.qat->layers;
    std::cerr << "tally-export: the model was trained for " << trained
              << " (training.qat): exporting it so (--quant=f16 for every matrix in F16)\n";
    return;
  }
  if (!r->quant || *r->quant != m.qat->format || r->quant_layers != m.qat->layers) {
    std::cerr << "tally-export: note: the model was trained for " << trained
              << " (training.qat); this export's weights are not the ones it trained with, so "
                 "its loss is not the job's quantized_val_loss\n";
  }
}

int WriteGgufFile(const tally::train::CheckpointModel& m, Request r) {
  namespace model = tally::model;
  QatDefaults(m, &r);
  auto vocab = model::GgufVocabFromRecord(m.tokenizer, m.config.vocab_size,
                                          absl::GetFlag(FLAGS_tokenizer_model));
  if (!vocab.ok()) return Fail(std::string(vocab.status().message()));
  for (const std::string& note : vocab->notes) std::cerr << "tally-export: note: " << note << "\n";
  model::GgufExportOptions options;
  options.quant = r.quant;
  options.quant_layers = r.quant_layers;
  options.name = std::filesystem::path(r.out).stem().string();
  if (m.seq_len > 0) options.context_length = m.seq_len;
  options.drop_routing_bias = absl::GetFlag(FLAGS_drop_routing_bias);
  options.vocab = *std::move(vocab);
  auto summary = model::WriteGguf(r.out, m.config, m.parameters, m.biases, options);
  if (!summary.ok()) return Fail(std::string(summary.status().message()));
  const std::string quant = r.quant
                                ? absl::StrCat(model::GgmlQuantName(*r.quant), " ",
                                               model::QuantLayersName(r.quant_layers), " (",
                                               summary->quantized_tensors, " tensors quantized)")
                                : "f16";
  std::cout << absl::StrFormat(
      "tally-export: %s (step %d) -> %s: llama GGUF, %d tensors, %d parameters, %s, %.1f MB\n",
      m.path, m.step, r.out, summary->tensors, summary->parameters, quant,
      static_cast<double>(summary->bytes) / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-export: a Tally checkpoint as a Hugging Face model folder or a llama.cpp GGUF "
      "file.\n\nUsage:\n"
      "  tally-export --checkpoint=FILE --out=DIR [--dtype=fp32|bf16]\n"
      "  tally-export --checkpoint=FILE --format=gguf [--quant=f16|q8_0|q4_0]\n"
      "               [--quant_layers=ffn|all_linear] --out=FILE.gguf\n"
      "  tally-export --job=jobs/N [--which=best|latest] [--format=...] --out=...\n"
      "hf writes config.json (LlamaForCausalLM, or MixtralForCausalLM for a softmax-routed "
      "MoE), model.safetensors, generation_config.json and the tokenizer; gguf one file of "
      "llama.cpp's llama architecture with the tokenizer in it. Exit 0 written, 1 refused or "
      "failed, 2 usage.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument ", rest[1]), 2);
  Request r;
  if (std::string usage = ParseRequest(&r); !usage.empty()) return Fail(usage, 2);
  std::string path = r.checkpoint, sha;
  if (!r.job.empty()) {
    auto picked = FromJob(r.job, r.which, argv[0]);
    if (!picked.ok()) return Fail(std::string(picked.status().message()));
    path = picked->first;
    sha = picked->second;
  }
  auto model = tally::train::ReadCheckpointModel(path, sha);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  return r.format == "gguf" ? WriteGgufFile(*model, r) : WriteHf(*model, r);
}
