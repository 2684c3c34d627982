// tally-train: the trainer with no controller. Reads a job spec (YAML or
// JSON, the same file tallyctl submits), trains on this machine and prints
// progress, evaluations and checkpoints.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/spec_yaml.h"
#include "worker/agent/train_spec.h"
#include "worker/train/checksum_file.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, spec, "", "job spec file (YAML or JSON)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(std::string, checkpoint_dir, "", "where to write checkpoints (default: none)");
ABSL_FLAG(std::string, resume, "", "a checkpoint file to continue from");
ABSL_FLAG(std::string, resume_sha256, "",
          "the SHA-256 --resume must have (what tallyd recorded for it, or sha256sum printed "
          "when it was written); default: the one in FILE.sha256 beside it, if any");
ABSL_FLAG(int, threads, 0, "CPU threads (default: LibTorch's choice)");
ABSL_FLAG(double, peak_tflops, 0, "device peak TFLOP/s, for model-FLOPs utilization");
ABSL_FLAG(int, log_every, 1, "print every N-th step");
ABSL_FLAG(std::string, metrics_out, "",
          "also write every step and evaluation here as JSON lines, at full precision");
ABSL_FLAG(int, rank, 0, "data parallel: this process's rank (0 hosts the rendezvous)");
ABSL_FLAG(int, world_size, 1,
          "data parallel: number of processes training this spec together (with one, "
          "spec.resources.gpu_count is ignored)");
ABSL_FLAG(std::string, rendezvous, "",
          "data parallel: host:port of rank 0's c10d store (rank 0 binds the port)");
ABSL_FLAG(std::string, rendezvous_host, "127.0.0.1",
          "data parallel: this process's address for its Gloo connections");

namespace {

class Printer final : public tally::train::TrainEvents {
 public:
  // quantized: what the quantized loss is of ("q4_0 ffn"); empty: none.
  Printer(int64_t max_steps, int log_every, std::ostream* jsonl, std::string quantized)
      : max_steps_(max_steps), log_every_(log_every), jsonl_(jsonl),
        quantized_(std::move(quantized)) {}
  void OnStart(const tally::train::RunInfo& i) override {
    std::cout << absl::StrFormat(
        "tally-train: %d parameters (%d active, %d in the embedding), %.3g training "
        "FLOPs/token, "
        "%d micro-batches/step, %s attention on %s; %d train / %d val documents, "
        "first-epoch packing efficiency %.4f; model state %.3g MB (activations aside)%s%s%s%s%s\n",
        i.num_parameters, i.num_active_parameters, i.num_embedding_parameters,
        i.flops_per_token,
        i.micro_batches_per_step, i.attention, i.device, i.train_docs, i.val_docs,
        i.packing_efficiency, i.state_bytes / 1e6,
        i.activation_bytes > 0
            ? absl::StrFormat(", plus about %.3g GB of activations per micro-batch and %.3g GB "
                              "of weight casts (estimated; %.3g GB a step in all)",
                              i.activation_bytes / 1e9, i.weight_cast_bytes / 1e9,
                              (i.state_bytes + i.activation_bytes + i.weight_cast_bytes) / 1e9)
            : "",
        i.start_step > 0 ? absl::StrFormat("; resumed at step %d", i.start_step) : "",
        i.num_resident_parameters < i.num_parameters
            ? absl::StrFormat("; experts sharded, %d parameters held by this rank",
                              i.num_resident_parameters)
            : "",
        i.teacher_parameters > 0
            ? absl::StrFormat("; distilling from a %d-parameter teacher (%.3g forward "
                              "FLOPs/token, counted above)",
                              i.teacher_parameters, i.teacher_flops_per_token)
            : "",
        i.eval_coverage.empty() ? "" : "\nevaluation sample: " + i.eval_coverage);
  }
  void OnStep(const tally::train::StepMetrics& m) override {
    if (jsonl_) {
      *jsonl_ << absl::StrFormat(
                     "{\"step\": %d, \"train_loss\": %.17g, \"grad_norm\": %.17g, "
                     "\"tokens\": %d, \"padding_tokens\": %d, \"step_seconds\": %.6f, "
                     "\"distill_kl\": %.17g}",
                     m.step, m.train_loss, m.grad_norm, m.tokens, m.padding_tokens,
                     m.step_seconds, m.distill_kl)
              << std::endl;
    }
    if (m.step % log_every_ != 0 && m.step != max_steps_) return;
    std::cout << absl::StrFormat(
        "step %6d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f useful tok/s  padding %.1f%%",
        m.step, max_steps_, m.train_loss, m.lr, m.grad_norm, m.useful_tokens_per_second,
        100 * m.padding_fraction);
    if (m.mfu > 0) {
      std::cout << absl::StrFormat("  mfu %.1f%% (executed %.1f%%)", 100 * m.mfu,
                                   100 * m.mfu_executed);
    }
    if (!m.moe.empty()) {
      std::cout << absl::StrFormat("  moe max/mean load %.2f", m.moe_max_over_mean_load);
    }
    if (m.distill_kl != 0) std::cout << absl::StrFormat("  distill kl %.4f", m.distill_kl);
    if (m.fp8_product_fraction > 0) {
      std::cout << absl::StrFormat("  fp8 %.0f%% of products, %d overflows",
                                   100 * m.fp8_product_fraction, m.fp8_overflows);
    }
    if (m.skipped) std::cout << "  (non-finite: update skipped)";
    std::cout << std::endl;
  }
  void OnEval(const tally::train::EvalMetrics& e) override {
    if (jsonl_) {
      *jsonl_ << absl::StrFormat(
                     "{\"eval_step\": %d, \"val_loss\": %.17g, \"doc_val_loss\": %.17g, "
                     "\"eval_docs\": %d, \"eval_targets\": %d",
                     e.step, e.val_loss, e.doc_val_loss, e.docs, e.target_tokens);
      if (e.quantized_val_loss) {
        *jsonl_ << absl::StrFormat(", \"quantized_val_loss\": %.17g", *e.quantized_val_loss);
      }
      *jsonl_ << "}" << std::endl;
    }
    std::cout << absl::StrFormat(
        "eval step %d: val_loss %.4f, %.3f bits/byte (%d tokens); document-weighted %.4f "
        "(%d documents)",
        e.step, e.val_loss, e.bits_per_byte, e.target_tokens, e.doc_val_loss, e.docs);
    if (e.quantized_val_loss) {
      std::cout << absl::StrFormat("; quantized_val_loss %.4f (%s)", *e.quantized_val_loss,
                                   quantized_);
    }
    std::cout << "\n";
  }
  void OnCheckpoint(const tally::train::CheckpointInfo& c) override {
    std::cout << absl::StrFormat("checkpoint step %d: %s sha256 %s\n", c.step, c.path,
                                 c.sha256.substr(0, 16));
  }

 private:
  int64_t max_steps_;
  int log_every_;
  std::ostream* jsonl_;
  std::string quantized_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-train: train one job spec here, without tallyd.\n\nUsage: tally-train "
      "--spec=job.yaml [--device=cpu] [--checkpoint_dir=DIR] [--resume=FILE "
      "[--resume_sha256=HEX]]");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    std::cerr << "tally-train: --spec is required (a job spec, e.g. examples/jobs/tiny.yaml)\n";
    return 2;
  }
  auto spec = tally::ReadJobSpecFile(path);
  if (!spec.ok()) {
    std::cerr << "tally-train: " << path << ": " << spec.status().message() << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_log_every) < 1) {
    std::cerr << "tally-train: --log_every: must be >= 1\n";
    return 2;
  }
  tally::train::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  if (absl::Status s = tally::train::CheckDevice(absl::GetFlag(FLAGS_device)); !s.ok()) {
    std::cerr << "tally-train: --device: " << s.message() << "\n";
    return 2;
  }
  tally::worker::DeviceOptions device;
  device.device = absl::GetFlag(FLAGS_device);
  device.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  device.peak_flops = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  device.parallel.rank = absl::GetFlag(FLAGS_rank);
  device.parallel.world_size = absl::GetFlag(FLAGS_world_size);
  device.parallel.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  device.parallel.rendezvous_prefix = "tally-train";
  device.parallel.rendezvous_local_host = absl::GetFlag(FLAGS_rendezvous_host);
  auto config = tally::worker::TrainConfigFromSpec(*spec, device);
  if (!config.ok()) {
    std::cerr << "tally-train: " << path << ": " << config.status().message() << "\n";
    return 2;
  }
  config->resume_path = absl::GetFlag(FLAGS_resume);
  std::string sha = absl::AsciiStrToLower(absl::GetFlag(FLAGS_resume_sha256));
  if (!sha.empty() && config->resume_path.empty()) {
    std::cerr << "tally-train: --resume_sha256 is the SHA-256 of --resume: give --resume too\n";
    return 2;
  }
  if (!sha.empty() && !tally::train::IsSha256Hex(sha)) {
    std::cerr << "tally-train: --resume_sha256: \"" << absl::GetFlag(FLAGS_resume_sha256)
              << "\" is not 64 hex digits (as sha256sum prints)\n";
    return 2;
  }
  std::string sha_source = sha.empty() ? "" : "--resume_sha256";
  if (!config->resume_path.empty() && sha.empty()) {
    // The trainer writes FILE.sha256 beside each checkpoint: without a
    // recorded hash, a checkpoint rewritten with a valid internal checksum
    // (an edited metadata block, an older file copied in its place) would
    // pass.
    const std::string sidecar = tally::train::ChecksumFilePath(config->resume_path);
    absl::StatusOr<std::string> recorded = tally::train::ReadChecksumFile(config->resume_path);
    if (recorded.ok()) {
      sha = *recorded;
      sha_source = sidecar;
      std::cout << "tally-train: checking " << config->resume_path << " against the SHA-256 in "
                << sidecar << "\n";
    } else if (absl::IsNotFound(recorded.status())) {
      std::cerr << "tally-train: warning: " << sidecar << " is missing and no --resume_sha256 "
                << "was given: " << config->resume_path << " is checked only against its own "
                << "internal checksum, which a rewritten checkpoint also passes\n";
    } else {
      std::cerr << "tally-train: --resume: " << recorded.status().message()
                << " (pass --resume_sha256 with the checkpoint's recorded SHA-256, or remove "
                << sidecar << ")\n";
      return 1;
    }
  }
  config->resume_sha256 = sha;
  std::ofstream jsonl;
  if (!absl::GetFlag(FLAGS_metrics_out).empty()) {
    jsonl.open(absl::GetFlag(FLAGS_metrics_out));
    if (!jsonl) {
      std::cerr << "tally-train: --metrics_out: cannot write " << absl::GetFlag(FLAGS_metrics_out)
                << "\n";
      return 2;
    }
  }
  std::string quantized;
  if (const auto& q = config->eval_quantized) {
    quantized = absl::StrCat(tally::model::QuantizationName(*q),
                             config->qat ? ", trained for it" : ", post-training");
  }
  Printer printer(config->max_steps, absl::GetFlag(FLAGS_log_every),
                  jsonl.is_open() ? &jsonl : nullptr, std::move(quantized));
  const tally::train::TrainResult r = tally::train::Train(*config, &printer, nullptr);
  if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
    std::cerr << "tally-train: failed: " << r.reason << "\n";
    if (!r.damaged_checkpoint.empty() && !sha_source.empty()) {
      std::cerr << "tally-train: the recorded SHA-256 came from " << sha_source << "\n";
    }
    return 1;
  }
  std::cout << "tally-train: " << r.reason << "\n";
  return 0;
}
