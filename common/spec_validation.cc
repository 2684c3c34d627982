#include "common/spec_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/experiment_spec.h"
#include "common/model_flops.h"
#include "common/text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tally {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using tally::v1::JobSpec;

constexpr size_t kMaxDisplayNameChars = 200;
constexpr size_t kMaxPathBytes = 4096;

class Problems {
 public:
  void Add(absl::string_view field, absl::string_view what) {
    list_.push_back(absl::StrCat("spec.", field, ": ", what));
  }
  template <typename T>
  void Range(absl::string_view field, T value, T lo, T hi) {
    if (value < lo || value > hi) {
      Add(field, absl::StrCat("must be between ", lo, " and ", hi, ", got ",
                              value));
    }
  }
  void Finite(absl::string_view field, double value, double lo, double hi) {
    if (!std::isfinite(value)) {
      Add(field, "must be a finite number");
    } else {
      Range(field, value, lo, hi);
    }
  }
  // The first kMaxListed problems, so a message stays short enough for a
  // gRPC status (its trailer is a few KiB) whatever the spec.
  absl::Status ToStatus() const {
    if (list_.empty()) return absl::OkStatus();
    constexpr size_t kMaxListed = 20;
    if (list_.size() <= kMaxListed) {
      return absl::InvalidArgumentError(absl::StrJoin(list_, "; "));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(list_.begin(), list_.begin() + kMaxListed, "; "),
        "; and ", list_.size() - kMaxListed, " more problems"));
  }

 private:
  std::vector<std::string> list_;
};

bool IsNameChar(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' ||
         c == '_' || c == '.' || c == '/';
}

std::string Quoted(absl::string_view s) { return QuoteForMessage(s); }

void CheckPrintable(absl::string_view field, absl::string_view value,
                    Problems* p) {
  if (std::optional<std::string> why = UnprintableReason(value)) {
    p->Add(field, absl::StrCat("must be printable text, but it ", *why));
  }
}

// A map entry's key as text, for sorting and for field paths: string keys as
// they are, numbers in decimal.
std::string MapKeyText(const Message& entry, const FieldDescriptor* key_f) {
  const Reflection* r = entry.GetReflection();
  switch (key_f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(entry, key_f);
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(entry, key_f));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(entry, key_f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(entry, key_f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(entry, key_f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, key_f) ? "true" : "false";
    default:
      return "?";
  }
}

// Every string in `m`, at any depth, must be printable: protobuf refuses to
// send a string that is not UTF-8, and these strings reach logs, terminals
// and file systems. Walks by reflection so a new string field is covered
// without a change here; map entries go in key order so the message is the
// same for equal specs.
void CheckAllStrings(const Message& m, const std::string& prefix, Problems* p) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = prefix + f->name();
    // A calibration's names and specs have checks of their own
    // (CheckCalibration), the specs' strings among them.
    if (f->message_type() == tally::v1::TimingCalibrationSpec::descriptor()) continue;
    if (f->is_map()) {
      const FieldDescriptor* key_f = f->message_type()->map_key();
      const FieldDescriptor* val_f = f->message_type()->map_value();
      std::vector<std::pair<std::string, const Message*>> entries;
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        const Message& entry = r->GetRepeatedMessage(m, f, i);
        entries.emplace_back(MapKeyText(entry, key_f), &entry);
      }
      std::sort(entries.begin(), entries.end());
      for (const auto& [key, entry] : entries) {
        const std::string entry_path =
            absl::StrCat(path, "[", Quoted(key), "]");
        if (key_f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          if (std::optional<std::string> why = UnprintableReason(key)) {
            p->Add(entry_path,
                   absl::StrCat("keys must be printable text, but this one ",
                                *why));
          }
        }
        const Reflection* er = entry->GetReflection();
        if (val_f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          CheckPrintable(entry_path, er->GetString(*entry, val_f), p);
        } else if (val_f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          CheckAllStrings(er->GetMessage(*entry, val_f), entry_path + ".", p);
        }
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          CheckAllStrings(r->GetRepeatedMessage(m, f, i),
                          absl::StrCat(path, "[", i, "]."), p);
        }
      } else {
        CheckAllStrings(r->GetMessage(m, f), path + ".", p);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(m, f); ++i) {
          CheckPrintable(absl::StrCat(path, "[", i, "]"),
                         r->GetRepeatedString(m, f, i), p);
        }
      } else {
        CheckPrintable(path, r->GetString(m, f), p);
      }
    }
  }
}

}  // namespace

void ApplySpecDefaults(JobSpec* spec) {
  auto* data = spec->mutable_data();
  if (data->packing() == tally::v1::PACKING_MODE_UNSPECIFIED) {
    data->set_packing(tally::v1::PACKING_MODE_PACKED);
  }
  if (data->shuffle_window() == 0) data->set_shuffle_window(1024);
  auto* moe = spec->mutable_model()->mutable_moe();
  if (moe->num_experts() > 0) {
    // Upcycling needs two experts a token (model.init_from.upcycle).
    if (moe->top_k() == 0) moe->set_top_k(spec->model().init_from().has_upcycle() ? 2 : 1);
    if (moe->every_n_layers() == 0) moe->set_every_n_layers(1);
    if (moe->router().empty()) moe->set_router("softmax");
  }
  auto* precision = spec->mutable_precision();
  if (precision->compute() == tally::v1::PRECISION_FP8) {
    if (precision->fp8_recipe() == tally::v1::FP8_RECIPE_UNSPECIFIED) {
      precision->set_fp8_recipe(tally::v1::FP8_RECIPE_DELAYED);
    }
    if (precision->amax_history_len() == 0) precision->set_amax_history_len(16);
  }
  auto* opt = spec->mutable_optimizer();
  // Unset, not zero: a value given is kept, and validation refuses one out
  // of range (lr: 0 names optimizer.lr instead of training at 3e-4).
  if (!opt->has_lr()) opt->set_lr(3e-4);
  if (!opt->has_beta1()) opt->set_beta1(0.9);
  if (!opt->has_beta2()) opt->set_beta2(0.95);
  if (!opt->has_eps()) opt->set_eps(1e-8);
  auto* training = spec->mutable_training();
  if (!training->has_micro_batch_rows()) training->set_micro_batch_rows(8);
  if (training->has_distill()) {
    auto* distill = training->mutable_distill();
    if (distill->temperature() == 0) distill->set_temperature(1.0);
    if (!distill->has_alpha()) distill->set_alpha(0.5);
  }
  // One micro-batch per rank and step.
  const int ranks = std::max(1, spec->resources().gpu_count());
  if (!training->has_global_batch_tokens()) {
    // In 128 bits: out-of-range factors must not overflow; validation
    // refuses them.
    const absl::int128 tokens = absl::int128(data->seq_len()) *
                                training->micro_batch_rows() * ranks;
    if (tokens > 0 && tokens <= std::numeric_limits<int64_t>::max()) {
      training->set_global_batch_tokens(static_cast<int64_t>(tokens));
    }
  }
  // QAT's quantized evaluation is of the format and layers it trains for.
  if (training->has_qat()) {
    auto* qat = training->mutable_qat();
    if (qat->layers().empty()) qat->set_layers("ffn");
    if (training->eval_quantized().empty()) training->set_eval_quantized(qat->format());
    if (training->eval_quantized_layers().empty()) {
      training->set_eval_quantized_layers(qat->layers());
    }
  }
  if (!training->eval_quantized().empty() && training->eval_quantized_layers().empty()) {
    training->set_eval_quantized_layers("ffn");
  }
  auto* es = spec->mutable_early_stopping();
  if (es->patience() > 0 && es->min_rel_delta() == 0 && es->min_delta() == 0) {
    es->set_min_rel_delta(0.03);  // an improvement is 3% better than the best
  }
  if (es->forecast() && es->forecast_min_evals() == 0) es->set_forecast_min_evals(4);
  auto* resources = spec->mutable_resources();
  if (resources->gpu_type().empty()) resources->set_gpu_type("cpu");
  if (resources->gpu_count() == 0) resources->set_gpu_count(1);
  if (resources->capacity().empty()) resources->set_capacity("any");
  if (spec->max_attempts() == 0) spec->set_max_attempts(3);
  if (spec->has_calibration()) {
    auto* cal = spec->mutable_calibration();
    if (cal->rounds() == 0) cal->set_rounds(kDefaultCalibrationRounds);
    if (cal->steps() == 0) cal->set_steps(kDefaultCalibrationSteps);
    // One level: a calibration inside one is refused, not defaulted.
    for (auto& v : *cal->mutable_variants()) {
      if (!v.spec().has_calibration()) ApplySpecDefaults(v.mutable_spec());
    }
  }
}

namespace {

// A model's weights named by a Hugging Face folder or a Tally checkpoint
// (model.init_from, training.distill.teacher): at most one, bounded paths.
void CheckWeightSource(Problems* p, const std::string& field, const std::string& hf,
                       const std::string& checkpoint) {
  if (!hf.empty() && !checkpoint.empty()) {
    p->Add(field, "name a Hugging Face folder (hf) or a Tally checkpoint (checkpoint), not both");
  }
  for (const auto& [name, path] : {std::pair<const char*, const std::string*>{"hf", &hf},
                                   std::pair<const char*, const std::string*>{"checkpoint",
                                                                              &checkpoint}}) {
    const std::string f = absl::StrCat(field, ".", name);
    if (path->size() > kMaxPathBytes) {
      p->Add(f, absl::StrCat("must be at most ", kMaxPathBytes, " bytes"));
    } else if (path->find('\0') != std::string::npos) {
      p->Add(f, "must not contain a NUL byte");
    }
  }
}

// model.init_from.upcycle: a dense source made Mixture-of-Experts by this
// spec's model.moe, which must keep the dense model's function at step 0.
void CheckUpcycle(Problems* p, const tally::v1::ModelSpec& model) {
  const auto& init = model.init_from();
  const auto& moe = model.moe();
  if (init.hf().empty() && init.checkpoint().empty()) {
    p->Add("model.init_from.upcycle",
           "needs the dense model to start from: set model.init_from.checkpoint or "
           "model.init_from.hf");
  }
  p->Finite("model.init_from.upcycle.noise_std", init.upcycle().noise_std(), 0, 1);
  if (moe.num_experts() < 2) {
    p->Add("model.moe.num_experts",
           absl::StrCat("upcycling makes the dense model Mixture-of-Experts: set "
                        "model.moe.num_experts to 2 or more (8 to 16 is usual), got ",
                        moe.num_experts()));
    return;
  }
  if (moe.top_k() < 2) {
    p->Add("model.moe.top_k",
           absl::StrCat("upcycling needs top_k >= 2, got ", moe.top_k(),
                        ": with one expert per token its output is scaled by the router's "
                        "probability, so the upcycled model would not start as the dense one"));
  }
  if (moe.shared_expert()) {
    p->Add("model.moe.shared_expert",
           "upcycling copies the dense feed-forward into every routed expert; a shared expert "
           "would add it a second time: remove shared_expert");
  }
}

// training.distill: the teacher, its optional shape, temperature and alpha.
void CheckDistill(Problems* p, const tally::v1::DistillSpec& d) {
  const auto& t = d.teacher();
  CheckWeightSource(p, "training.distill.teacher", t.hf(), t.checkpoint());
  if (t.hf().empty() && t.checkpoint().empty()) {
    p->Add("training.distill.teacher",
           "is required: name the teacher's Tally checkpoint (checkpoint: FILE) or Hugging "
           "Face folder (hf: DIR)");
  }
  if (d.temperature() != 0) {  // 0: the default, 1
    p->Finite("training.distill.temperature", d.temperature(), 0.05, 100);
  }
  if (d.has_alpha()) p->Finite("training.distill.alpha", d.alpha(), 0, 1);
  if (!t.has_model()) return;
  const auto& m = t.model();
  const std::string f = "training.distill.teacher.model";
  p->Range(f + ".num_layers", m.num_layers(), 1, 256);
  p->Range(f + ".d_model", m.d_model(), 1, 65536);
  p->Range(f + ".num_heads", m.num_heads(), 1, 1024);
  p->Range(f + ".d_ff", m.d_ff(), 0, 1 << 20);
  p->Range(f + ".vocab_size", m.vocab_size(), 0, 1 << 22);
  p->Range(f + ".moe.num_experts", m.moe().num_experts(), 0, 1024);
  if (m.moe().num_experts() > 0) {
    p->Range(f + ".moe.top_k", m.moe().top_k(), 1, m.moe().num_experts());
    p->Range(f + ".moe.every_n_layers", m.moe().every_n_layers(), 0,
             std::max(1, m.num_layers()));
  }
  if (m.has_init_from()) {
    p->Add(f + ".init_from", "the teacher's weights are training.distill.teacher's own; "
                             "remove init_from here");
  }
}

// model: sizes, the heads, init_from and its upcycle (MoE in CheckMoe).
void CheckModel(const JobSpec& spec, Problems* p) {
  const auto& model = spec.model();
  p->Range("model.num_layers", model.num_layers(), 1, 256);
  p->Range("model.d_model", model.d_model(), 1, 65536);
  p->Range("model.num_heads", model.num_heads(), 1, 1024);
  if (model.num_heads() > 0 && model.d_model() > 0) {
    if (model.d_model() % model.num_heads() != 0) {
      p->Add("model.num_heads",
            absl::StrCat("must divide model.d_model (", model.d_model(),
                         "), got ", model.num_heads()));
    } else if ((model.d_model() / model.num_heads()) % 2 != 0) {
      p->Add("model.num_heads",
            "d_model / num_heads must be even (RoPE rotates pairs)");
    }
  }
  p->Range("model.d_ff", model.d_ff(), 0, 1 << 20);
  const auto& init = model.init_from();
  CheckWeightSource(p, "model.init_from", init.hf(), init.checkpoint());
  if (init.has_upcycle()) CheckUpcycle(p, model);
  p->Range("model.vocab_size", model.vocab_size(), 0, 1 << 22);
}

// model.moe: routing for an MoE model; for a dense one, no MoE option set.
void CheckMoe(const JobSpec& spec, Problems* p) {
  const auto& model = spec.model();
  const auto& moe = model.moe();
  p->Range("model.moe.num_experts", moe.num_experts(), 0, 1024);
  if (moe.num_experts() > 0) {
    p->Range("model.moe.top_k", moe.top_k(), 1, moe.num_experts());
    p->Range("model.moe.every_n_layers", moe.every_n_layers(), 1,
            std::max(1, model.num_layers()));
    const int ranks = spec.resources().gpu_count();
    if (moe.expert_parallel() && ranks > 1 && moe.num_experts() % ranks != 0) {
      p->Add("model.moe.expert_parallel",
            absl::StrCat("num_experts (", moe.num_experts(),
                         ") must be a multiple of resources.gpu_count (", ranks,
                         "); change either, or turn expert_parallel off"));
    }
    if (moe.router() != "softmax" && moe.router() != "sigmoid") {
      p->Add("model.moe.router",
            absl::StrCat("must be \"softmax\" or \"sigmoid\", got ",
                         Quoted(moe.router())));
    }
  } else {
    // A dense model: any other MoE field set is a mistake. Listed by
    // reflection so a new MoE field is covered.
    std::vector<const FieldDescriptor*> set;
    moe.GetReflection()->ListFields(moe, &set);
    std::vector<std::string> options;
    for (const FieldDescriptor* f : set) {
      if (f->number() != tally::v1::MoeSpec::kNumExpertsFieldNumber) {
        options.push_back(absl::StrCat("model.moe.", f->name()));
      }
    }
    if (!options.empty()) {
      p->Add("model.moe.num_experts",
            absl::StrCat("MoE options are set (", absl::StrJoin(options, ", "),
                         ") but num_experts is ", moe.num_experts(),
                         "; set num_experts >= 1 or remove them"));
    }
  }
  p->Finite("model.moe.aux_loss_coef", moe.aux_loss_coef(), 0, 10);
  p->Finite("model.moe.z_loss_coef", moe.z_loss_coef(), 0, 10);
  p->Finite("model.moe.capacity_factor", moe.capacity_factor(), 0, 64);
}

void CheckPrecision(const tally::v1::PrecisionSpec& precision, Problems* p) {
  if (!tally::v1::Precision_IsValid(precision.compute())) {
    p->Add("precision.compute", "must be one of PRECISION_FP32, "
                               "PRECISION_BF16, PRECISION_FP8");
  }
  if (precision.compute() != tally::v1::PRECISION_FP8 &&
      (precision.fp8_recipe() != tally::v1::FP8_RECIPE_UNSPECIFIED ||
       precision.amax_history_len() != 0)) {
    p->Add("precision.fp8_recipe",
          "FP8 options are set but precision.compute is not PRECISION_FP8");
  }
  p->Range("precision.amax_history_len", precision.amax_history_len(), 0,
          1024);
  p->Range("precision.fp8_margin", precision.fp8_margin(), 0, 8);
}

void CheckData(const tally::v1::DataSpec& data, Problems* p) {
  if (data.train_path().empty()) {
    p->Add("data.train_path",
          "is required: the dataset prefix written by tally-prep");
  }
  if (data.train_path().size() > kMaxPathBytes) {
    p->Add("data.train_path",
          absl::StrCat("must be at most ", kMaxPathBytes, " bytes"));
  }
  if (data.val_path().size() > kMaxPathBytes) {
    p->Add("data.val_path",
          absl::StrCat("must be at most ", kMaxPathBytes, " bytes"));
  }
  p->Range("data.seq_len", data.seq_len(), 8, 1 << 17);
  p->Range("data.shuffle_window", data.shuffle_window(), 1, 1 << 20);
  if (!tally::v1::PackingMode_IsValid(data.packing())) {
    p->Add("data.packing", "must be PACKING_MODE_PACKED, "
                          "PACKING_MODE_PAD_TO_SEQ_LEN or "
                          "PACKING_MODE_PAD_TO_LONGEST");
  }
}

void CheckOptimizer(const tally::v1::OptimizerSpec& opt, Problems* p) {
  p->Finite("optimizer.lr", opt.lr(), 1e-9, 10);
  p->Finite("optimizer.min_lr", opt.min_lr(), 0, opt.lr());
  p->Finite("optimizer.weight_decay", opt.weight_decay(), 0, 10);
  p->Finite("optimizer.beta1", opt.beta1(), 0, 0.999999);
  p->Finite("optimizer.beta2", opt.beta2(), 0, 0.999999);
  p->Finite("optimizer.eps", opt.eps(), 1e-12, 1);
  p->Finite("optimizer.grad_clip", opt.grad_clip(), 0, 1e6);
}

// training: distillation, steps and warmup, the batch and the intervals.
void CheckTraining(const JobSpec& spec, Problems* p) {
  const auto& data = spec.data();
  const auto& opt = spec.optimizer();
  const auto& training = spec.training();
  if (training.has_distill()) CheckDistill(p, training.distill());
  p->Range<int64_t>("training.max_steps", training.max_steps(), 1,
                   int64_t{1} << 40);
  p->Range<int64_t>("optimizer.warmup_steps", opt.warmup_steps(), 0,
                   std::max<int64_t>(0, training.max_steps()));
  p->Range("training.micro_batch_rows", training.micro_batch_rows(), 1, 65536);
  const int64_t micro_tokens =
      int64_t{data.seq_len()} * training.micro_batch_rows();
  if (training.global_batch_tokens() <= 0 ||
      (micro_tokens > 0 && training.global_batch_tokens() % micro_tokens)) {
    p->Add("training.global_batch_tokens",
          absl::StrCat("must be a positive multiple of data.seq_len * "
                       "training.micro_batch_rows (",
                       micro_tokens, "), got ",
                       training.global_batch_tokens()));
  } else if (micro_tokens > 0 && spec.resources().gpu_count() > 1 &&
             // Factors in range (else refused on their own), so the
             // product in the message cannot overflow.
             micro_tokens <= (int64_t{1} << 40) &&
             spec.resources().gpu_count() <= 1024 &&
             (training.global_batch_tokens() / micro_tokens) %
                 spec.resources().gpu_count()) {
    p->Add("training.global_batch_tokens",
          absl::StrCat("with resources.gpu_count ", spec.resources().gpu_count(),
                       " it must be a multiple of data.seq_len * training.micro_batch_rows * "
                       "gpu_count (", micro_tokens * spec.resources().gpu_count(),
                       "), so every rank gets the same micro-batches; got ",
                       training.global_batch_tokens()));
  }
  p->Range<int64_t>("training.eval_interval_steps",
                   training.eval_interval_steps(), 0, int64_t{1} << 40);
  p->Range<int64_t>("training.eval_tokens", training.eval_tokens(), 0,
                   int64_t{1} << 40);
  p->Range<int64_t>("training.checkpoint_interval_steps",
                   training.checkpoint_interval_steps(), 0, int64_t{1} << 40);
}

// training.qat and training.eval_quantized: GGUF's block formats, the
// layers they cover, and weights whose input dimensions hold whole blocks.
void CheckQuantization(const JobSpec& spec, Problems* p) {
  const auto& training = spec.training();
  const bool formats_ok = [&] {
    bool ok = true;
    auto format = [&](const std::string& field, const std::string& value, bool may_be_empty) {
      if ((value.empty() && may_be_empty) || value == "q8_0" || value == "q4_0") return;
      p->Add(field, absl::StrCat("must be q8_0 or q4_0 (llama.cpp's GGUF block formats)",
                                 may_be_empty ? ", or empty for none" : "", "; got \"",
                                 value, "\""));
      ok = false;
    };
    auto layers = [&](const std::string& field, const std::string& value) {
      if (value.empty() || value == "ffn" || value == "all_linear") return;
      p->Add(field, absl::StrCat("must be ffn (the feed-forward weights, experts included) or "
                                 "all_linear (those and attention's projections); got \"",
                                 value, "\""));
      ok = false;
    };
    if (training.has_qat()) {
      format("training.qat.format", training.qat().format(), false);
      layers("training.qat.layers", training.qat().layers());
    }
    format("training.eval_quantized", training.eval_quantized(), true);
    layers("training.eval_quantized_layers", training.eval_quantized_layers());
    return ok;
  }();
  if (!formats_ok) return;
  const bool quantized = !training.eval_quantized().empty();
  if (!quantized && !training.eval_quantized_layers().empty()) {
    p->Add("training.eval_quantized_layers",
           "is set but training.eval_quantized is not: name the format (q8_0 or q4_0)");
  }
  if (training.has_qat() && !training.eval_quantized().empty() &&
      (training.eval_quantized() != training.qat().format() ||
       training.eval_quantized_layers() != training.qat().layers())) {
    p->Add("training.eval_quantized",
           absl::StrCat("with training.qat the quantized evaluation is QAT's own (",
                        training.qat().format(), ", ", training.qat().layers(),
                        "); leave training.eval_quantized and eval_quantized_layers unset"));
  }
  if (training.has_qat() && spec.precision().compute() == tally::v1::PRECISION_FP8) {
    p->Add("training.qat",
           "cannot be combined with precision.compute PRECISION_FP8 (the FP8 linears would "
           "quantize the same weights to FP8 instead of the GGUF format): train with "
           "PRECISION_BF16 or PRECISION_FP32, or leave training.qat unset and measure "
           "post-training quantization with training.eval_quantized");
  }
  if (!quantized && !training.has_qat()) return;
  const std::string field = training.has_qat() ? "training.qat" : "training.eval_quantized";
  const int64_t D = spec.model().d_model();
  if (D > 0 && D % 32 != 0) {
    p->Add(field, absl::StrCat("quantizes blocks of 32 weights along each weight's input "
                               "dimension: model.d_model must be a multiple of 32, got ", D));
  }
  const int64_t F = tally::ResolveDff(D, spec.model().d_ff());
  if (D > 0 && F % 32 != 0) {
    p->Add(field, absl::StrCat("quantizes blocks of 32 weights along each weight's input "
                               "dimension: model.d_ff must be a multiple of 32, got ", F));
  }
}

void CheckEarlyStopping(const tally::v1::EarlyStoppingSpec& es, Problems* p) {
  p->Range("early_stopping.patience", es.patience(), 0, 10000);
  p->Finite("early_stopping.min_rel_delta", es.min_rel_delta(), 0, 0.999);
  p->Finite("early_stopping.min_delta", es.min_delta(), 0, 1e6);
  p->Range("early_stopping.min_evals", es.min_evals(), 0, 10000);
  if (es.divergence_factor() != 0) {
    p->Finite("early_stopping.divergence_factor", es.divergence_factor(), 1.0,
             1e6);
  }
  p->Range("early_stopping.baseline_evals", es.baseline_evals(), 0, 10000);
  p->Finite("early_stopping.baseline_min_rel_gain", es.baseline_min_rel_gain(),
           0, 0.999);
  p->Finite("early_stopping.target_val_loss", es.target_val_loss(), 0, 1e6);
  if (es.target_rel_to_baseline() != 0) {
    p->Finite("early_stopping.target_rel_to_baseline", es.target_rel_to_baseline(), 1e-6,
             0.999999);
  }
  if (es.target_val_loss() != 0 && es.target_rel_to_baseline() != 0) {
    p->Add("early_stopping.target_rel_to_baseline",
          "set either target_val_loss or target_rel_to_baseline, not both");
  }
  if (!es.metric().empty() && es.metric() != "val_loss" &&
      es.metric() != "quantized_val_loss") {
    p->Add("early_stopping.metric",
           absl::StrCat("must be val_loss (the default) or quantized_val_loss; got \"",
                        es.metric(), "\""));
  }
  p->Range("early_stopping.forecast_min_evals", es.forecast_min_evals(), 0, 10000);
  if (es.forecast() && es.forecast_min_evals() != 0 && es.forecast_min_evals() < 2) {
    p->Add("early_stopping.forecast_min_evals",
          "a curve needs at least 2 evaluations to be fitted (default 4)");
  }
}

void CheckResources(const tally::v1::ResourceSpec& res, Problems* p) {
  const std::string& gpu_type = res.gpu_type();
  bool gpu_type_ok = !gpu_type.empty() && gpu_type.size() <= 32;
  for (char c : gpu_type) gpu_type_ok = gpu_type_ok && IsNameChar(c) && c != '/';
  if (!gpu_type_ok) {
    p->Add("resources.gpu_type",
          absl::StrCat("must be 1-32 characters of [a-z0-9._-] (e.g. \"cpu\", "
                       "\"h200\"), got ",
                       Quoted(gpu_type)));
  }
  p->Range("resources.gpu_count", res.gpu_count(), 1, 1024);
  if (!res.capacity().empty() && res.capacity() != "any" && res.capacity() != "spot" &&
      res.capacity() != "on_demand") {
    p->Add("resources.capacity",
          absl::StrCat("must be \"spot\", \"on_demand\" or \"any\" (the default), got ",
                       Quoted(res.capacity())));
  }
}

// Label keys and values, in key order, so equal specs get the same message.
void CheckLabels(const JobSpec& spec, Problems* p) {
  if (spec.labels_size() > 64) p->Add("labels", "at most 64 labels");
  // In key order, so equal specs get the same message.
  std::vector<std::pair<std::string, std::string>> labels(
      spec.labels().begin(), spec.labels().end());
  std::sort(labels.begin(), labels.end());
  for (const auto& [key, value] : labels) {
    bool key_ok = !key.empty() && key.size() <= 63 &&
                  (absl::ascii_islower(key[0]) || absl::ascii_isdigit(key[0]));
    for (char c : key) key_ok = key_ok && IsNameChar(c);
    if (!key_ok) {
      p->Add(absl::StrCat("labels[", Quoted(key), "]"),
            "keys are 1-63 characters of [a-z0-9._/-], starting with a "
            "letter or digit");
    }
    if (value.size() > 256) {
      p->Add(absl::StrCat("labels[", Quoted(key), "]"),
            "values are at most 256 characters");
    }
  }
}

// A timing calibration: its bounds, and each spec it times as a job of its
// own (their problems named under calibration.variants[i].spec).
void CheckCalibration(const JobSpec& spec, Problems* p) {
  if (!spec.has_calibration()) return;
  const tally::v1::TimingCalibrationSpec& cal = spec.calibration();
  p->Range("calibration.rounds", cal.rounds(), 1, kMaxCalibrationRounds);
  p->Range("calibration.steps", cal.steps(), 1, kMaxCalibrationSteps);
  if (cal.variants_size() == 0 || cal.variants_size() > kMaxExperimentVariants) {
    p->Add("calibration.variants", absl::StrCat("must list 1 to ", kMaxExperimentVariants,
                                                " specs to time, got ", cal.variants_size()));
  }
  // The worker trains exactly this many steps (and reports no step past
  // max_steps): the job's max_steps is that number, nothing else.
  const int64_t total = CalibrationTotalSteps(cal);
  if (cal.variants_size() > 0 && cal.rounds() > 0 && cal.steps() > 0 &&
      spec.training().max_steps() != total) {
    p->Add("training.max_steps",
           absl::StrCat("a calibration trains ", total,
                        " steps in all (calibration.variants x rounds x (steps + 1)); set it to ",
                        total, ", got ", spec.training().max_steps()));
  }
  std::vector<std::string> seen;
  for (int i = 0; i < cal.variants_size() && i < kMaxExperimentVariants; ++i) {
    const tally::v1::CalibrationVariant& v = cal.variants(i);
    const std::string field = absl::StrCat("calibration.variants[", i, "]");
    if (!IsVariantName(v.name())) {
      p->Add(field + ".name", absl::StrCat(Quoted(v.name()), " must be 1 to ",
                                           kMaxVariantNameChars,
                                           " characters of a-z, 0-9, '.', '_' and '-'"));
    } else if (std::find(seen.begin(), seen.end(), v.name()) != seen.end()) {
      p->Add(field + ".name", absl::StrCat("\"", v.name(), "\" is listed twice; names must be unique"));
    }
    seen.push_back(v.name());
    if (v.spec().has_calibration()) {
      p->Add(field + ".spec.calibration",
             "a spec to time cannot be a calibration itself; remove it");
      continue;
    }
    if (absl::Status s = ValidateJobSpec(v.spec()); !s.ok()) {
      p->Add(field + ".spec", s.message());
    }
  }
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  Problems p;
  if (Utf8Length(spec.display_name()) > kMaxDisplayNameChars) {
    p.Add("display_name", absl::StrCat("must be at most ", kMaxDisplayNameChars,
                                       " characters, got ",
                                       Utf8Length(spec.display_name())));
  }

  CheckModel(spec, &p);
  CheckMoe(spec, &p);
  CheckPrecision(spec.precision(), &p);
  CheckData(spec.data(), &p);
  CheckOptimizer(spec.optimizer(), &p);
  CheckTraining(spec, &p);
  CheckEarlyStopping(spec.early_stopping(), &p);
  CheckQuantization(spec, &p);
  if (spec.early_stopping().metric() == "quantized_val_loss" &&
      spec.training().eval_quantized().empty() && !spec.training().has_qat()) {
    p.Add("early_stopping.metric",
          "quantized_val_loss needs a quantized evaluation: set training.qat (train for the "
          "format) or training.eval_quantized (measure post-training quantization)");
  }
  p.Finite("budget.max_dollars", spec.budget().max_dollars(), 0, 1e9);

  CheckResources(spec.resources(), &p);

  p.Range("priority", spec.priority(), -1000, 1000);
  p.Range("max_attempts", spec.max_attempts(), 1, 100);
  p.Range("max_preemptions", spec.max_preemptions(), 0, 1000000);

  CheckLabels(spec, &p);
  CheckCalibration(spec, &p);

  CheckAllStrings(spec, "", &p);
  return p.ToStatus();
}

absl::Status PrepareJobSpec(JobSpec* spec) {
  ApplySpecDefaults(spec);
  return ValidateJobSpec(*spec);
}

std::vector<int> AllowedWorldSizes(const JobSpec& spec) {
  const int gpus = std::max(1, spec.resources().gpu_count());
  std::vector<int> out = {gpus};
  const int64_t micro_tokens =
      int64_t{spec.data().seq_len()} * spec.training().micro_batch_rows();
  if (micro_tokens <= 0 || spec.training().global_batch_tokens() <= 0) return out;
  const int64_t micro_per_step = spec.training().global_batch_tokens() / micro_tokens;
  const auto& moe = spec.model().moe();
  for (int w = gpus - 1; w >= 1; --w) {
    if (micro_per_step % w != 0) continue;
    if (moe.expert_parallel() && moe.num_experts() > 0 && moe.num_experts() % w != 0) continue;
    out.push_back(w);
  }
  return out;
}

}  // namespace tally
