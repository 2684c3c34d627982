#include "worker/dist/grad_sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace tally::dist {

class GradientSync::Hook final : public torch::autograd::PostAccumulateGradHook {
 public:
  Hook(GradientSync* sync, size_t param) : sync_(sync), param_(param) {}
  void operator()(const torch::autograd::Variable&) override { sync_->OnReady(param_); }

 private:
  GradientSync* sync_;
  size_t param_;
};

GradientSync::GradientSync(Group* group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(group), params_(std::move(params)), bucket_of_(params_.size()) {
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || bytes + b > bucket_bytes ||
        params_[buckets_.back().params.front()].scalar_type() != p.scalar_type()) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += b;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k], std::make_unique<Hook>(this, k));
  }
}

GradientSync::~GradientSync() {
  for (auto& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
}

void GradientSync::Arm() {
  armed_ = true;
  next_launch_ = 0;
  launched_early_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.flat = at::Tensor();
    b.work.reset();
  }
}

void GradientSync::OnReady(size_t param) {
  if (!armed_) return;  // an earlier micro-batch: gradients still accumulate
  Bucket& b = buckets_[bucket_of_[param]];
  if (--b.pending > 0) return;
  // In bucket order only: a later bucket that is ready waits for the ones
  // before it.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Launch(next_launch_++);
    ++launched_early_;
  }
}

void GradientSync::Launch(size_t index) {
  Bucket& b = buckets_[index];
  std::vector<at::Tensor> parts;
  for (size_t k : b.params) {
    at::Tensor& g = params_[k].mutable_grad();
    if (!g.defined()) g = at::zeros_like(params_[k]);
    parts.push_back(g.reshape({-1}));
  }
  b.flat = at::cat(parts);
  b.work = group_->StartAllReduceSum(b.flat);
}

void GradientSync::Finish() {
  armed_ = false;
  while (next_launch_ < buckets_.size()) Launch(next_launch_++);
  for (Bucket& b : buckets_) {
    b.work->Wait();
    int64_t offset = 0;
    for (size_t k : b.params) {
      at::Tensor& g = params_[k].mutable_grad();
      g.copy_(b.flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
    b.flat = at::Tensor();
    b.work.reset();
  }
}

}  // namespace tally::dist
