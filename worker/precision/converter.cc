#include "worker/precision/converter.h"

#include <cmath>
#include <iostream>
#include <limits>
#include <set>

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include "absl/strings/str_cat.h"
#include "kernels/fused_cast.h"
#include "worker/precision/grouped.h"
#include "worker/precision/quantize.h"

namespace tally::precision {

using internal::ReadHost;

namespace {

bool FfnSite(const std::string& site) {
  for (const char* w : {".w1", ".w2", ".w3"}) {
    const size_t at = site.rfind(w);
    if (at != std::string::npos && at + 3 == site.size()) return true;
  }
  return false;
}

}  // namespace

Fp8Linears::Fp8Linears(RecipeConfig config, at::Device device)
    : config_(config),
      recipe_(MakeFp8Recipe(config)),
      table_(config, device),
      counts_(at::zeros({2}, at::TensorOptions().dtype(at::kLong).device(device))) {}

Fp8Linears::~Fp8Linears() = default;

Fp8Layer& Fp8Linears::LayerFor(const std::string& site) {
  auto& slot = layers_[site];
  if (slot) return *slot;
  slot = std::make_unique<Fp8Layer>();
  Fp8Layer& layer = *slot;
  layer.site = site;
  layer.group = FfnSite(site) ? "ffn" : "attention";
  auto add = [&](Fp8Format f, const char* which) {
    groups_.push_back(layer.group + "." + which);
    used_.push_back(false);
    return table_.Add(f);
  };
  // w1 and w3 read the same h: one input entry for both, so its cast is
  // made once (InputImage) and both layers' checkpoint entries hold it.
  auto ends_with = [&](const char* tail) {
    return site.size() >= 3 && site.compare(site.size() - 3, 3, tail) == 0;
  };
  if (ends_with(".w3")) layer.x = LayerFor(site.substr(0, site.size() - 3) + ".w1").x;
  layer.input_read_again = ends_with(".w1") || ends_with(".w3");
  if (layer.x < 0) layer.x = add(Fp8Format::kE4M3, "input");
  layer.w = add(Fp8Format::kE4M3, "weight");
  layer.g = add(Fp8Format::kE5M2, "grad");
  return layer;
}

void Fp8Linears::Declare(const std::vector<std::string>& sites) {
  for (const auto& site : sites) LayerFor(site);
}

at::Tensor Fp8Linears::Linear(const at::Tensor& x, const at::Tensor& w, const std::string& site) {
  TORCH_CHECK(x.device() == table_.device(), "FP8 linear ", site, ": its scaling state is on ",
              table_.device(), ", the input on ", x.device());
  return Fp8Linear(x, w, &LayerFor(site), this);
}

at::Tensor Fp8Linears::GateUpLinear(const at::Tensor& x, const at::Tensor& w1,
                                    const at::Tensor& w3, const std::string& site1,
                                    const std::string& site3) {
  TORCH_CHECK(x.device() == table_.device(), "FP8 linear ", site1, ": its scaling state is on ",
              table_.device(), ", the input on ", x.device());
  Fp8Layer& layer1 = LayerFor(site1);
  return Fp8GateUpLinear(x, w1, w3, &layer1, &LayerFor(site3), this);
}

at::Tensor Fp8Linears::SwiGluLinear(const at::Tensor& y13, const at::Tensor& w2,
                                    const std::string& site) {
  TORCH_CHECK(y13.device() == table_.device(), "FP8 linear ", site, ": its scaling state is on ",
              table_.device(), ", the input on ", y13.device());
  return Fp8SwiGluLinear(y13, w2, &LayerFor(site), this);
}

bool Fp8Linears::Groups(const at::Tensor& x, int64_t out, int64_t in) const {
  if (!config_.grouped_experts || !recipe_->PerTensor() || !grouped_off_.empty()) return false;
  return x.is_cuda() ? out % 16 == 0 && in % 16 == 0 : config_.grouped_on_cpu;
}

at::Tensor Fp8Linears::GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                                     const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                                     const std::vector<std::string>& sites) {
  TORCH_CHECK(counts.size() == sites.size() && ends.size() == sites.size() &&
                  static_cast<int64_t>(sites.size()) == w_EOI.size(0),
              "GroupedLinear: ", sites.size(), " sites for ", w_EOI.size(0), " experts");
  std::vector<const Fp8Layer*> layers;
  for (const std::string& site : sites) layers.push_back(&LayerFor(site));
  return Fp8GroupedLinear(x_RI, w_EOI, this, layers, counts, ends);
}

void Fp8Linears::TurnGroupedOff(std::string why) {
  if (!grouped_off_.empty()) return;
  grouped_off_ = std::move(why);
  std::cerr << "tally: FP8 grouped expert products are off for this run: " << grouped_off_
            << "; the experts run one by one\n";
}

void Fp8Linears::NoteUsed(int64_t t) { used_[t] = true; }

Fp8Image Fp8Linears::Cast(int64_t t, const at::Tensor& x2_in, bool force_overflows,
                          bool activation, const at::Tensor& rows_into) {
  const bool record = training_;
  const bool cuda = x2_in.is_cuda();
  const bool emulate_bf16 = !cuda && config_.emulate_bf16_intermediates;
  // CUDA's activations and gradients are BF16 (autocast) when they are cast.
  const at::Tensor x2 = emulate_bf16 && activation ? x2_in.to(at::kBFloat16) : x2_in;
  bool cast_records = false;
  Fp8Image image;
  image.scale = recipe_->ScaleFor(&table_, t, x2, record, &cast_records);
  at::Tensor source = x2;
  if (force_overflows) {
    // The amax histories never see the forced values: take the amax first.
    if (cast_records) {
      CastFp8(x2, {}, table_.format(t), false, false,
              {table_.step_amax(t), table_.step_finite(t), {}});
      cast_records = false;
    }
    source = internal::ForceOverflows(x2, image.scale.scale, config_.test_overflow_fraction);
  }
  CastSinks sinks;
  if (record) {
    sinks.counts = counts_;
    stats_.elements += x2.numel();
    NoteUsed(t);
  }
  if (cast_records) {
    sinks.amax = table_.step_amax(t);
    sinks.amax_finite = table_.step_finite(t);
  }
  Fp8Cast c = CastFp8(source, image.scale.scale, table_.format(t), true, cuda, sinks, rows_into);
  image.data = c.data;
  image.data_t = c.data_t;
  if (!cuda) image.dequantized = internal::Dequantized(image.data, image.scale.scale);
  image.bf16_outputs = emulate_bf16;
  return image;
}

Fp8Image Fp8Linears::InputImage(const Fp8Layer& layer, const at::Tensor& x2, bool read_again) {
  auto it = kept_inputs_.find(layer.x);
  if (it != kept_inputs_.end()) {
    KeptInput kept = std::move(it->second);
    kept_inputs_.erase(it);
    const c10::intrusive_ptr<c10::StorageImpl> storage = kept.storage.lock();
    if (storage && storage.get() == x2.storage().unsafeGetStorageImpl() &&
        kept.offset == x2.storage_offset() && x2.sizes() == kept.sizes &&
        x2.strides() == kept.strides && x2.scalar_type() == kept.dtype &&
        x2._version() == kept.version) {
      return kept.image;
    }
  }
  const bool force = training_ && config_.test_overflow_fraction > 0;
  Fp8Image image = Cast(layer.x, x2, force, /*activation=*/true);
  if (read_again) {
    kept_inputs_[layer.x] = {x2.storage().getWeakStorageImpl(), x2.storage_offset(),
                             x2.sizes().vec(), x2.strides().vec(), x2.scalar_type(),
                             x2._version(), image};
  }
  return image;
}

bool Fp8Linears::Fresh(const at::Tensor& cached, int64_t version, const at::Tensor& w) {
  return cached.defined() && cached.data_ptr() == w.data_ptr() && cached.sizes() == w.sizes() &&
         cached.strides() == w.strides() && version == w._version();
}

Fp8Image Fp8Linears::WeightImage(const Fp8Layer& layer, const at::Tensor& w) {
  auto it = weights_.find(layer.w);
  if (it != weights_.end() && Fresh(it->second.weight, it->second.version, w)) {
    return it->second.image;
  }
  const at::Tensor wd = w.detach();
  Fp8Image image = Cast(layer.w, wd, false, /*activation=*/false);
  weights_[layer.w] = {wd, w._version(), image};
  return image;
}

const Fp8Linears::JointWeight& Fp8Linears::JointWeightImage(const Fp8Layer& layer1,
                                                            const at::Tensor& w1,
                                                            const Fp8Layer& layer3,
                                                            const at::Tensor& w3) {
  auto it = joint_weights_.find(layer1.w);
  if (it != joint_weights_.end() && Fresh(it->second.w1, it->second.version1, w1) &&
      Fresh(it->second.w3, it->second.version3, w3)) {
    return it->second.image;
  }
  TORCH_CHECK(w1.sizes() == w3.sizes() && w1.dim() == 2,
              "the joint w1|w3 product takes two weights of one [F, K] shape, got ", w1.sizes(),
              " and ", w3.sizes());
  const int64_t F = w1.size(0), K = w1.size(1);
  const at::Tensor w1d = w1.detach(), w3d = w3.detach();
  JointWeight j;
  // Each weight's row-major bytes are cast straight into its row block.
  j.data = at::empty({2 * F, K}, w1.options().dtype(Fp8Dtype(Fp8Format::kE4M3)));
  j.w1 = Cast(layer1.w, w1d, false, /*activation=*/false, j.data.narrow(0, 0, F));
  j.w3 = Cast(layer3.w, w3d, false, /*activation=*/false, j.data.narrow(0, F, F));
  j.inv_scale_row = at::cat({j.w1.scale.inv_scale.expand({F}), j.w3.scale.inv_scale.expand({F})})
                        .reshape({1, 2 * F});
  if (!w1.is_cuda()) {
    j.dequantized = at::cat({j.w1.dequantized, j.w3.dequantized});
    j.w1.dequantized = j.dequantized.narrow(0, 0, F);
    j.w3.dequantized = j.dequantized.narrow(0, F, F);
  }
  weights_[layer1.w] = {w1d, w1._version(), j.w1};
  weights_[layer3.w] = {w3d, w3._version(), j.w3};
  auto& slot = joint_weights_[layer1.w];
  slot = {w1d, w3d, w1._version(), w3._version(), std::move(j)};
  return slot.image;
}

bool Fp8Linears::SwiGluCastAhead(const Fp8Layer& layer) const {
  return recipe_->PerTensor() && recipe_->ScaleKnownAhead(table_, layer.x) &&
         !(training_ && config_.test_overflow_fraction > 0);
}

Fp8Image Fp8Linears::SwiGluInputImage(const Fp8Layer& layer, const at::Tensor& y13) {
  TORCH_CHECK(SwiGluCastAhead(layer), "the fused SwiGLU cast of ", layer.site,
              " needs its scale ahead");
  const int64_t t = layer.x;
  const bool cuda = y13.is_cuda();
  const bool record = training_;
  const bool emulate_bf16 = !cuda && config_.emulate_bf16_intermediates;
  const at::Tensor x = y13.scalar_type() == at::kBFloat16 || y13.scalar_type() == at::kFloat
                           ? y13.contiguous()
                           : y13.to(at::kFloat).contiguous();
  const int64_t F = x.size(-1) / 2, M = x.numel() / (2 * F);
  bool cast_records = false;
  Fp8Image image;
  image.scale = recipe_->ScaleFor(&table_, t, at::Tensor(), record, &cast_records);
  const auto bytes = x.options().dtype(at::kByte);
  at::Tensor data = at::empty({M, F}, bytes);
  at::Tensor data_t = cuda ? at::empty({F, M}, bytes) : at::Tensor();
  kernels::SwiGluCastArgs a;
  a.x13 = x.data_ptr();
  a.x_dtype = x.scalar_type() == at::kBFloat16 ? kernels::Dtype::kBFloat16
                                               : kernels::Dtype::kFloat32;
  a.rows = M;
  a.cols = F;
  // The value cast is the SwiGLU's output in the products' input dtype:
  // BF16 on CUDA (autocast's), and on the CPU when it emulates that.
  a.y_dtype = cuda || emulate_bf16 ? kernels::Dtype::kBFloat16 : kernels::Dtype::kFloat32;
  a.fp8.scale = image.scale.scale.data_ptr<float>();
  a.fp8.format = kernels::Fp8Kind::kE4M3;
  a.fp8.out = data.data_ptr<uint8_t>();
  a.fp8.out_t = cuda ? data_t.data_ptr<uint8_t>() : nullptr;
  if (cast_records) {
    a.fp8.amax = table_.step_amax(t).data_ptr<float>();
    a.fp8.amax_finite = table_.step_finite(t).data_ptr<float>();
  }
  if (record) {
    a.fp8.counts = static_cast<uint64_t*>(counts_.data_ptr());
    stats_.elements += M * F;
    NoteUsed(t);
  }
  if (cuda) {
#if defined(TALLY_WITH_CUDA)
    const std::string err = kernels::SwiGluCastCuda(a, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err.empty(), "fused SwiGLU + FP8 cast: ", err);
#else
    TORCH_CHECK(false, "fused SwiGLU + FP8 cast: this build has no CUDA");
#endif
  } else {
    kernels::SwiGluCastReference(a);
  }
  const at::ScalarType e4m3 = Fp8Dtype(Fp8Format::kE4M3);
  image.data = data.view(e4m3);
  if (cuda) image.data_t = data_t.view(e4m3);
  if (!cuda) image.dequantized = internal::Dequantized(image.data, image.scale.scale);
  image.bf16_outputs = emulate_bf16;
  return image;
}

Fp8Image Fp8Linears::GradImage(const Fp8Layer& layer, const at::Tensor& g2) {
  return Cast(layer.g, g2, false, /*activation=*/true);
}

const internal::RowwiseWeight& Fp8Linears::RowwiseWeightImage(const Fp8Layer& layer,
                                                              const at::Tensor& w) {
  auto it = rowwise_weights_.find(layer.w);
  if (it != rowwise_weights_.end() && Fresh(it->second.weight, it->second.version, w)) {
    return it->second.image;
  }
  const at::Tensor wd = w.detach();
  const std::string group = layer.group + ".weight";
  internal::RowwiseWeight image{
      internal::RowwiseCast(this, wd, Fp8Format::kE4M3, group, /*columns=*/false),
      internal::RowwiseCast(this, wd, Fp8Format::kE4M3, "", /*columns=*/true)};
  if (!wd.is_cuda()) {
    for (internal::RowwiseImage* i : {&image.rows, &image.cols}) {
      i->dequantized = internal::Dequantized(i->data, i->scale);
    }
  }
  auto& slot = rowwise_weights_[layer.w];
  slot = {wd, w._version(), std::move(image)};
  return slot.image;
}

void Fp8Linears::CountProducts(int64_t total, int64_t fp8, int64_t grouped) {
  if (!training_) return;
  stats_.total_products += total;
  stats_.fp8_products += fp8;
  stats_.grouped_products += grouped;
}

void Fp8Linears::AddRowwise(const QuantStats& q) {
  if (!training_) return;
  stats_.elements += q.elements;
  if (q.pending.defined()) counts_.add_(q.pending.to(counts_.device()));
}

void Fp8Linears::ReportRowwiseAmax(const std::string& group, const at::Tensor& amax) {
  if (!training_) return;
  at::Tensor a = amax.detach().reshape({1}).to(at::kFloat);
  auto it = rowwise_amax_.find(group);
  rowwise_amax_[group] = it == rowwise_amax_.end() ? a : at::maximum(it->second, a);
}

void Fp8Linears::SetTraining(bool training) {
  if (training == training_) return;
  training_ = training;
  // Casts made in one mode are not the other's (only training ones record).
  weights_.clear();
  joint_weights_.clear();
  rowwise_weights_.clear();
  kept_inputs_.clear();
}

Fp8Stats Fp8Linears::TakeStats() {
  Fp8Stats out = std::move(stats_);
  stats_ = Fp8Stats{};
  kept_inputs_.clear();
  const int64_t T = table_.size();
  // Everything the step left on the device, in one read: counts, every
  // tensor's raw and finite amax, the row-wise amaxes.
  std::vector<at::Tensor> parts = {counts_.to(at::kFloat), table_.step_amax(),
                                   table_.step_finite()};
  for (const auto& [group, amax] : rowwise_amax_) parts.push_back(amax);
  const std::vector<double> v = ReadHost(at::cat(parts));
  out.overflows += static_cast<int64_t>(v[0]);
  out.underflows += static_cast<int64_t>(v[1]);
  for (int64_t t = 0; t < T; ++t) {
    if (!used_[t]) continue;
    const double a = v[2 + t];
    auto [it, fresh] = out.amax.emplace(groups_[t], a);
    if (!fresh && !std::isnan(it->second) && (std::isnan(a) || a > it->second)) it->second = a;
  }
  std::vector<double> finite(v.begin() + 2 + T, v.begin() + 2 + 2 * T);
  table_.ObserveStep(finite);
  size_t i = 2 + 2 * T;
  for (const auto& [group, amax] : rowwise_amax_) out.amax[group] = v[i++];
  rowwise_amax_.clear();
  counts_.zero_();
  std::fill(used_.begin(), used_.end(), false);
  return out;
}

void Fp8Linears::OnOptimizerStep() {
  recipe_->OnOptimizerStep(&table_);
  weights_.clear();
  joint_weights_.clear();
  rowwise_weights_.clear();
  kept_inputs_.clear();
}

std::vector<std::pair<std::string, at::Tensor>> Fp8Linears::State() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!recipe_->KeepsState() || layers_.empty()) return out;
  const std::vector<at::Tensor> state = table_.State();
  for (const auto& [site, layer] : layers_) {
    out.emplace_back("fp8." + site + ".input", state[layer->x]);
    out.emplace_back("fp8." + site + ".weight", state[layer->w]);
    out.emplace_back("fp8." + site + ".grad", state[layer->g]);
  }
  return out;
}

namespace {

// "fp8.<site>.<which>" split; false when it is not of that form.
bool SplitStateName(const std::string& name, std::string* site, std::string* which) {
  if (name.rfind("fp8.", 0) != 0) return false;
  const size_t dot = name.rfind('.');
  if (dot <= 4) return false;
  *site = name.substr(4, dot - 4);
  *which = name.substr(dot + 1);
  return *which == "input" || *which == "weight" || *which == "grad";
}

}  // namespace

absl::Status Fp8Linears::CheckState(const std::map<std::string, at::Tensor>& tensors,
                                    const std::vector<std::string>& sites, int64_t step) const {
  const std::set<std::string> known(sites.begin(), sites.end());
  for (const auto& [name, t] : tensors) {
    std::string site, which;
    if (!SplitStateName(name, &site, &which) || !known.count(site)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " is not FP8 scaling state of this model (expected fp8.",
          "<layer site>.{input,weight,grad})"));
    }
    const std::string problem = table_.Check(t, step);
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("FP8 scaling state ", name,
                                                     problem.rfind("is ", 0) == 0 ? " " : ": ",
                                                     problem));
    }
  }
  return absl::OkStatus();
}

bool Fp8Linears::LoadState(const std::map<std::string, at::Tensor>& tensors, std::string* bad) {
  for (const auto& [name, t] : tensors) {
    std::string site, which;
    if (name.rfind("fp8.", 0) != 0) continue;
    if (!SplitStateName(name, &site, &which)) {
      *bad = name;
      return false;
    }
    const Fp8Layer& layer = LayerFor(site);
    const int64_t entry = which == "input" ? layer.x : which == "weight" ? layer.w : layer.g;
    if (!table_.LoadState(entry, t)) {
      *bad = name;
      return false;
    }
  }
  weights_.clear();
  joint_weights_.clear();
  rowwise_weights_.clear();
  kept_inputs_.clear();
  return true;
}

}  // namespace tally::precision
