#include "worker/precision/converter.h"

#include <iostream>

#include "worker/precision/grouped.h"
#include "worker/precision/quantize.h"

namespace tally::precision {

using internal::ReadHost;

Fp8Linears::Fp8Linears(RecipeConfig config) : config_(config) {}
Fp8Linears::~Fp8Linears() = default;

Fp8Linears::Layer& Fp8Linears::LayerFor(const std::string& site) {
  auto& slot = layers_[site];
  if (!slot) slot = std::make_unique<Layer>(site, config_);
  return *slot;
}

at::Tensor Fp8Linears::Linear(const at::Tensor& x, const at::Tensor& w,
                              const std::string& site) {
  // The context outlives the autograd graph: it lives in the layer map.
  Layer& layer = LayerFor(site);
  auto& context = contexts_[site];
  context = {&layer, &stats_, &training_, &config_};
  return Fp8Linear(x, w, &context);
}

bool Fp8Linears::Groups(const at::Tensor& x, int64_t out, int64_t in) const {
  if (!config_.grouped_experts || config_.recipe == Recipe::kRowwise || !grouped_off_.empty()) {
    return false;
  }
  return x.is_cuda() ? out % 16 == 0 && in % 16 == 0 : config_.grouped_on_cpu;
}

at::Tensor Fp8Linears::GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                                     const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                                     const std::vector<std::string>& sites) {
  TORCH_CHECK(counts.size() == sites.size() && ends.size() == sites.size() &&
                  static_cast<int64_t>(sites.size()) == w_EOI.size(0),
              "GroupedLinear: ", sites.size(), " sites for ", w_EOI.size(0), " experts");
  std::vector<Context*> contexts;
  for (const std::string& site : sites) {
    Layer& layer = LayerFor(site);
    auto& context = contexts_[site];
    context = {&layer, &stats_, &training_, &config_};
    contexts.push_back(&context);
  }
  return Fp8GroupedLinear(x_RI, w_EOI, this, contexts, counts, ends);
}

void Fp8Linears::TurnGroupedOff(std::string why) {
  if (!grouped_off_.empty()) return;
  grouped_off_ = std::move(why);
  std::cerr << "tally: FP8 grouped expert products are off for this run: " << grouped_off_
            << "; the experts run one by one\n";
}

void Fp8Linears::ResolvePending() {
  std::vector<TensorScaling*> which;
  std::vector<at::Tensor> parts;
  for (auto& [site, layer] : layers_) {
    for (TensorScaling* t : {&layer->x, &layer->w, &layer->g}) {
      if (!t->pending_last().defined()) continue;
      which.push_back(t);
      parts.push_back(t->pending_last());
      parts.push_back(t->pending_step());
    }
  }
  if (parts.empty()) return;
  const std::vector<double> v = ReadHost(at::stack(parts));
  for (size_t i = 0; i < which.size(); ++i) which[i]->Resolve(v[2 * i], v[2 * i + 1]);
}

void Fp8Linears::OnOptimizerStep() {
  ResolvePending();
  for (auto& [site, layer] : layers_) {
    layer->x.Step();
    layer->w.Step();
    layer->g.Step();
  }
}

Fp8Stats Fp8Linears::TakeStats() {
  Fp8Stats out = std::move(stats_);
  stats_ = Fp8Stats{};
  // Everything the step left on the device, in one read.
  std::vector<at::Tensor> parts;
  if (out.pending_counts.defined()) parts.push_back(out.pending_counts.to(at::kDouble));
  for (const auto& [group, amax] : out.pending_amax) parts.push_back(amax.reshape({1}));
  if (!parts.empty()) {
    const std::vector<double> v = ReadHost(at::cat(parts));
    size_t i = 0;
    if (out.pending_counts.defined()) {
      out.overflows += static_cast<int64_t>(v[i++]);
      out.underflows += static_cast<int64_t>(v[i++]);
    }
    for (const auto& [group, amax] : out.pending_amax) out.amax[group] = v[i++];
  }
  out.pending_counts = at::Tensor();
  out.pending_amax.clear();
  return out;
}

void Fp8Linears::Declare(const std::vector<std::string>& sites) {
  for (const auto& site : sites) LayerFor(site);
}

std::vector<double> Fp8Linears::StepAmax() {
  ResolvePending();
  std::vector<double> out;
  for (const auto& [site, layer] : layers_) {
    out.push_back(layer->x.step_amax());
    out.push_back(layer->w.step_amax());
    out.push_back(layer->g.step_amax());
  }
  return out;
}

void Fp8Linears::SetStepAmax(const std::vector<double>& amax) {
  size_t i = 0;
  for (auto& [site, layer] : layers_) {
    if (i + 3 > amax.size()) return;
    layer->x.set_step_amax(amax[i++]);
    layer->w.set_step_amax(amax[i++]);
    layer->g.set_step_amax(amax[i++]);
  }
}

std::vector<std::pair<std::string, at::Tensor>> Fp8Linears::State() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (config_.recipe == Recipe::kRowwise) return out;  // nothing carries over
  for (const auto& [site, layer] : layers_) {
    out.emplace_back("fp8." + site + ".input", layer->x.State());
    out.emplace_back("fp8." + site + ".weight", layer->w.State());
    out.emplace_back("fp8." + site + ".grad", layer->g.State());
  }
  return out;
}

bool Fp8Linears::LoadState(const std::map<std::string, at::Tensor>& tensors,
                           std::string* missing) {
  for (const auto& [name, t] : tensors) {
    if (name.rfind("fp8.", 0) != 0) continue;
    const size_t dot = name.rfind('.');
    const std::string site = name.substr(4, dot - 4), which = name.substr(dot + 1);
    Layer& layer = LayerFor(site);
    TensorScaling* s = which == "input" ? &layer.x : which == "weight" ? &layer.w : &layer.g;
    if (!s->LoadState(t)) {
      *missing = name;
      return false;
    }
  }
  return true;
}

}  // namespace tally::precision
