// GradientSync: data-parallel gradient all-reduce that overlaps the backward
// pass, as PyTorch's DDP reducer does. Parameters are put in fixed buckets
// (in reverse order, since the last layers' gradients are final first);
// during an armed backward a post-accumulate-grad hook on every parameter
// marks it ready, and a bucket whose gradients are all final is all-reduced
// at once, on the backend's threads, while autograd goes on. Buckets are
// launched strictly in bucket order, so every rank issues the same
// collectives in the same order whichever parameters its batches reached.
//
// Use: Arm() before the backward of a step's last micro-batch, Finish()
// after it: it launches what is left (a parameter without a gradient joins
// as zeros), waits, and writes the sums into the gradients.
#ifndef TALLY_WORKER_DIST_GRAD_SYNC_H_
#define TALLY_WORKER_DIST_GRAD_SYNC_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/dist/group.h"

namespace tally::dist {

class GradientSync {
 public:
  GradientSync(Group* group, std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  void Arm();
  // Throws CollectiveError when a peer is gone.
  void Finish();
  // Buckets launched while the last backward was still running.
  int launched_during_backward() const { return launched_early_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> params;
    int pending = 0;
    at::Tensor flat;
    std::unique_ptr<Group::Pending> work;
  };
  void OnReady(size_t param);
  void Launch(size_t bucket);
  class Hook;

  Group* group_;
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  bool armed_ = false;
  size_t next_launch_ = 0;
  int launched_early_ = 0;
};

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_GRAD_SYNC_H_
