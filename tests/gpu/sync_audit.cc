// Host synchronisations of whole training steps, counted and located.
//
// CUDA's sync-debug mode makes every synchronising call LibTorch makes (an
// .item(), a copy to or from pageable memory, an op that sizes its output
// from data, a stream or event synchronisation) call
// c10::cuda::warn_or_error_on_sync() first. This binary defines that
// function itself: LibTorch's libraries import it, so the dynamic linker
// binds their calls to the executable's definition, which records the
// calling thread's stack instead of warning. That catches the syncs of the
// forward, of the autograd engine's backward thread and of the optimizer
// alike, each with its own stack. Every distinct stack is symbolized with
// addr2line (tests/gpu/run.sh builds with -g1, so the trainer's code has
// line tables) and printed with its count per step: the innermost frame in
// Tally's sources (file:line and function), the ATen op Tally called
// (at::_ops::<op>), and the Tally frames above it.
//
// Cases: BF16, FP8 (delayed scaling), MoE BF16 and MoE FP8 (grouped
// experts), each --steps steps of --micro_batches micro-batches with no
// evaluation; the first step (allocations, first casts and scales) is left
// out of the count. The last line, "summary syncs <case>=<per step> ...",
// is for tests/gpu/run.sh. On a CPU device nothing synchronises: it says so
// and exits 0. Asserts nothing (cuda_parity_test asserts that forward and
// backward never wait).
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "worker/train/trainer.h"

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(std::string, device, "cuda:0", "cpu or cuda:N");
ABSL_FLAG(int, layers, 4, "transformer blocks");
ABSL_FLAG(int, d_model, 512, "model width");
ABSL_FLAG(int, seq_len, 1024, "row length");
ABSL_FLAG(int, rows, 2, "rows per micro-batch");
ABSL_FLAG(int, micro_batches, 2, "micro-batches per step");
ABSL_FLAG(int, steps, 4, "optimizer steps per case (the first is not counted)");
ABSL_FLAG(int, experts, 8, "experts of the MoE cases (top-2)");
ABSL_FLAG(std::string, cases, "bf16,fp8,moe_bf16,moe_fp8", "which cases, comma-separated");

namespace {

constexpr int kMaxFrames = 64;

// What the replacement below records, between Start() and Stop().
struct Recorder {
  std::mutex mu;
  bool on = false;
  int64_t total = 0;
  std::map<std::vector<void*>, int64_t> stacks;
};

Recorder& recorder() {
  static Recorder* r = new Recorder;
  return *r;
}

}  // namespace

#if defined(TALLY_WITH_CUDA)
namespace c10::cuda {

// Replaces libc10_cuda's definition (see the top of the file): called by
// LibTorch before each synchronising call while the sync-debug mode is not
// disabled. Records; never warns, never throws.
void warn_or_error_on_sync() {
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.on) return;
  ++r.total;
  ++r.stacks[std::vector<void*>(frames + 1, frames + n)];
}

}  // namespace c10::cuda
#endif

namespace {

std::string Demangle(const char* name) {
  if (name == nullptr) return "";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return out;
}

// One frame: its module and the address addr2line wants (the call
// instruction's: a return address minus one).
struct Frame {
  std::string module;
  uintptr_t offset = 0;
  std::string symbol;  // the dynamic symbol dladdr found, demangled ("" if none)
  bool main = false;   // in this executable
};

bool MainIsPie() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  unsigned char h[18] = {};
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  return h[16] == 3;  // e_type ET_DYN
}

Frame Describe(void* address) {
  static const void* main_base = [] {
    Dl_info self;
    return dladdr(reinterpret_cast<void*>(&Demangle), &self) ? self.dli_fbase : nullptr;
  }();
  static const bool pie = MainIsPie();
  Frame f;
  Dl_info info;
  const uintptr_t pc = reinterpret_cast<uintptr_t>(address) - 1;
  if (!dladdr(address, &info)) {
    f.offset = pc;
    return f;
  }
  static const std::string main_path = [] {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    return std::string(path, n > 0 ? n : 0);
  }();
  f.main = info.dli_fbase == main_base;
  f.module = f.main ? main_path : (info.dli_fname ? info.dli_fname : "");
  f.offset = f.main && !pie ? pc : pc - reinterpret_cast<uintptr_t>(info.dli_fbase);
  f.symbol = Demangle(info.dli_sname);
  return f;
}

// file:line and function of each (module, offset), inline chains innermost
// first: addr2line -a -f -C -i, once per module.
using Location = std::vector<std::pair<std::string, std::string>>;  // (function, file:line)
std::map<std::pair<std::string, uintptr_t>, Location> Symbolize(
    const std::map<std::string, std::vector<uintptr_t>>& by_module) {
  std::map<std::pair<std::string, uintptr_t>, Location> out;
  for (const auto& [module, offsets] : by_module) {
    std::string cmd = "addr2line -a -f -C -i -e '" + module + "'";
    for (uintptr_t o : offsets) cmd += absl::StrFormat(" 0x%x", o);
    FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
    if (p == nullptr) continue;
    std::string text;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) text.append(buf, n);
    pclose(p);
    uintptr_t current = 0;
    std::vector<std::string> lines = absl::StrSplit(text, '\n');
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.rfind("0x", 0) == 0) {
        current = std::strtoull(l.c_str(), nullptr, 16);
        continue;
      }
      if (l.empty() || i + 1 >= lines.size()) continue;
      out[{module, current}].push_back({l, lines[i + 1]});
      ++i;
    }
  }
  return out;
}

// file:line relative to the source tree, "" outside it (LibTorch's and the
// standard library's headers); addr2line's " (discriminator N)" dropped.
std::string SourceRelative(const std::string& file_line) {
  const std::string root = TALLY_SOURCE_DIR "/";
  if (file_line.rfind(root, 0) != 0) return "";
  std::string rel = file_line.substr(root.size());
  return rel.substr(0, rel.find(" ("));
}

// The report of one case: each distinct call site with its count per step.
void Report(const std::string& name, const Recorder& r, int counted_steps, std::ostream& os) {
  std::map<std::string, std::vector<uintptr_t>> by_module;
  std::map<std::vector<void*>, std::vector<Frame>> frames;
  for (const auto& [stack, n] : r.stacks) {
    std::vector<Frame>& fs = frames[stack];
    for (void* a : stack) {
      fs.push_back(Describe(a));
      if (fs.back().main) by_module[fs.back().module].push_back(fs.back().offset);
    }
  }
  const auto where = Symbolize(by_module);
  // Stacks that differ only outside Tally's code are one site.
  std::map<std::string, int64_t> sites;
  for (const auto& [stack, n] : r.stacks) {
    std::string tally_frames, op;
    int shown = 0;
    for (const Frame& f : frames[stack]) {
      if (!f.main) {
        if (tally_frames.empty() && f.symbol.rfind("at::_ops::", 0) == 0) {
          op = f.symbol.substr(0, f.symbol.find("::call"));  // the outermost so far
        }
        continue;
      }
      auto it = where.find({f.module, f.offset});
      if (it == where.end()) continue;
      for (const auto& [function, file_line] : it->second) {
        const std::string rel = SourceRelative(file_line);
        if (rel.empty() || shown >= 3) continue;
        tally_frames += (shown == 0 ? "" : " <- ") + rel +
                        (shown == 0 ? "  (" + function.substr(0, 80) + ")" : "");
        ++shown;
      }
    }
    if (tally_frames.empty()) tally_frames = "(no frame in Tally's sources: LibTorch itself)";
    sites[tally_frames + (op.empty() ? "" : "  via " + op)] += n;
  }
  os << absl::StrFormat("sync audit, %s: %.1f syncs per step (%d in steps 2-%d)\n", name,
                        counted_steps > 0 ? static_cast<double>(r.total) / counted_steps : 0.0,
                        r.total, counted_steps + 1);
  for (const auto& [site, n] : sites) {
    os << absl::StrFormat("    %6.1f/step  %s\n", static_cast<double>(n) / counted_steps, site);
  }
}

// Counts from the end of the first step to the end of the last.
struct Window : tally::train::TrainEvents {
  explicit Window(int last) : last(last) {}
  void OnStep(const tally::train::StepMetrics& m) override {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lock(r.mu);
    r.on = m.step >= 1 && m.step < last;
    steps = m.step;
  }
  int last;
  int64_t steps = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    std::cerr << "sync_audit: --train_path is required (a tally-prep dataset prefix)\n";
    return 2;
  }
  if (auto s = tally::train::CheckDevice(device); !s.ok()) {
    std::cerr << "sync_audit: --device: " << s.message() << "\n";
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2) {
    std::cerr << "sync_audit: --steps must be at least 2 (the first is not counted)\n";
    return 2;
  }
#if defined(TALLY_WITH_CUDA)
  const bool cuda = device.rfind("cuda", 0) == 0;
#else
  const bool cuda = false;
#endif
  if (!cuda) {
    std::cout << "sync audit: " << device
              << " has no host synchronisations to count (CUDA only); nothing run\n"
              << "summary syncs skipped\n";
    return 0;
  }
#if defined(TALLY_WITH_CUDA)
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
#endif
  std::string summary = "summary syncs";
  const std::vector<std::string> cases = absl::StrSplit(absl::GetFlag(FLAGS_cases), ',');
  for (const std::string& name : cases) {
    tally::train::TrainConfig c;
    c.data.train_path = absl::GetFlag(FLAGS_train_path);
    c.device = device;
    c.model.num_layers = absl::GetFlag(FLAGS_layers);
    c.model.d_model = absl::GetFlag(FLAGS_d_model);
    c.model.num_heads = std::max<int64_t>(1, c.model.d_model / 128);
    c.data.seq_len = absl::GetFlag(FLAGS_seq_len);
    c.micro_batch_rows = absl::GetFlag(FLAGS_rows);
    c.global_batch_tokens = static_cast<int64_t>(absl::GetFlag(FLAGS_micro_batches)) *
                            c.micro_batch_rows * c.data.seq_len;
    c.max_steps = steps;
    c.optimizer.lr = 3e-4;
    c.optimizer.warmup_steps = 1;
    c.optimizer.grad_clip = 1.0;
    c.seed = 1;
    c.fp8 = name == "fp8" || name == "moe_fp8";
    if (name == "moe_bf16" || name == "moe_fp8") {
      c.model.moe.num_experts = absl::GetFlag(FLAGS_experts);
      c.model.moe.top_k = 2;
    } else if (name != "bf16" && name != "fp8") {
      std::cerr << "sync_audit: --cases: unknown case " << name
                << " (bf16, fp8, moe_bf16, moe_fp8)\n";
      return 2;
    }
    {
      Recorder& r = recorder();
      std::lock_guard<std::mutex> lock(r.mu);
      r.on = false;
      r.total = 0;
      r.stacks.clear();
    }
    Window w(steps);
    const tally::train::TrainResult result = tally::train::Train(c, &w, nullptr);
    {
      Recorder& r = recorder();
      std::lock_guard<std::mutex> lock(r.mu);
      r.on = false;
    }
    if (result.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
      std::cout << "sync audit, " << name << ": the run failed: " << result.reason << "\n";
      summary += " " + name + "=failed";
      continue;
    }
    const std::string label = absl::StrFormat(
        "%s (%d layers x %d, %d micro-batches of %d x %d tokens)", name, c.model.num_layers,
        c.model.d_model, absl::GetFlag(FLAGS_micro_batches), c.micro_batch_rows, c.data.seq_len);
    Report(label, recorder(), steps - 1, std::cout);
    absl::StrAppendFormat(&summary, " %s=%.1f", name,
                          static_cast<double>(recorder().total) / (steps - 1));
  }
  std::cout << summary << "\n";
  return 0;
}
