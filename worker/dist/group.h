// A process group for data-parallel training: PyTorch's own c10d engine
// (ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA) behind a small
// interface, so only group.cc includes the c10d headers.
//
// Rendezvous: rank 0 hosts a c10d TCPStore at `store_address` (it binds the
// port; the others connect to it), and every key of one attempt sits under
// `prefix`, so a store never mixes two attempts.
//
// Collectives block until every rank has joined them. A rank that dies makes
// its peers' next collective fail (a closed connection; or, if it hangs,
// `timeout_seconds`): they throw CollectiveError, which the trainer reports
// as a retryable failure so tallyd requeues the job as a whole.
//
// Thread-safety: one thread uses a Group at a time.
#ifndef TALLY_WORKER_DIST_GROUP_H_
#define TALLY_WORKER_DIST_GROUP_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally::dist {

struct GroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_address;  // host:port of rank 0's TCPStore
  std::string prefix;         // e.g. "jobs/7/attempt-2"
  // Gloo: the address this rank's own connections bind to; it must reach
  // and be reachable from every other rank.
  std::string local_host = "127.0.0.1";
  std::string device = "cpu";  // cpu: Gloo; cuda:N: NCCL
  double timeout_seconds = 120;
};

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Group {
 public:
  virtual ~Group() = default;
  // Joins the group: rank 0 starts the store and every rank waits for all
  // the others (up to timeout_seconds). Errors name what failed: the
  // address, a timeout, a backend this build lacks.
  static absl::StatusOr<std::unique_ptr<Group>> Create(const GroupOptions& options);

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "gloo" or "nccl"

  // Sums each tensor in place over the ranks. Tensors of one dtype are
  // flattened into buckets of at most bucket_bytes, every bucket is launched
  // before the first is awaited, and the results are copied back.
  virtual void AllReduceSum(const std::vector<at::Tensor>& tensors,
                            int64_t bucket_bytes = 25 << 20) = 0;
  // Starts summing a contiguous tensor in place over the ranks and returns
  // at once; Wait() finishes it (and throws CollectiveError on failure).
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void Wait() = 0;
  };
  virtual std::unique_ptr<Pending> StartAllReduceSum(const at::Tensor& tensor) = 0;
  // Elementwise maximum over the ranks, in place.
  virtual void AllReduceMax(const at::Tensor& tensor) = 0;
  // Every rank's tensors become `root`'s.
  virtual void Broadcast(const std::vector<at::Tensor>& tensors, int root) = 0;
  virtual void Barrier() = 0;
  // Rows of `x`: send[j] go to rank j; returns recv[j] rows from each rank j,
  // in rank order.
  virtual at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& recv) = 0;
  // Another group of the same ranks over the same store, under its own key
  // prefix: its collectives need no ordering with this group's (e.g. expert
  // all-to-alls in the backward pass beside gradient all-reduces). Every
  // rank calls it, in the same order.
  virtual absl::StatusOr<std::unique_ptr<Group>> NewGroup(const std::string& name) = 0;
};

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_GROUP_H_
