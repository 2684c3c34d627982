// Expert parallelism, applied to the model from outside: an ExpertsHook
// (model/moe.h) that deals a layer's E experts to the ranks of a group in
// contiguous blocks (rank r computes experts [r·E/W, (r+1)·E/W)). Every rank
// routes its own tokens; the hook sends each kept assignment to its expert's
// rank and gets the result back, by all-to-all, in the forward pass and
// again (the routes reversed) in the backward pass. The counts that size
// those exchanges are exchanged first, on the device, and read back by the
// MoE layer with its own in its one read (model/moe.cc lists it); nothing
// here reads the device, and what goes up to it goes from pinned memory
// without waiting (model::Upload). A rank's block runs
// through the model's own expert code (grouped products or the loop). The
// expert weights may stay replicated (the trainer then sums their gradients
// over ranks like any other) or be sharded (Transformer::ShardExperts: each
// rank holds only its block, whose gradient already has every rank's share).
#ifndef TALLY_WORKER_DIST_EXPERT_PARALLEL_H_
#define TALLY_WORKER_DIST_EXPERT_PARALLEL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/dist/group.h"
#include "worker/model/moe.h"

namespace tally::dist {

// The all-to-all the hook needs, apart from the group, so tests can stand in.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rows of `x`: the first send[0] go to rank 0, the next send[1] to rank
  // 1, ...; returns the rows received, recv[j] from rank j, in rank order.
  // Every rank calls it the same number of times, in the same order.
  virtual at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& recv) = 0;
};

// ExpertExchange over a process group (Group::AllToAll).
class GroupExchange final : public ExpertExchange {
 public:
  explicit GroupExchange(Group* group) : group_(group) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv) override {
    return group_->AllToAll(x, send, recv);
  }

 private:
  Group* group_;
};

// ExpertExchange::AllToAll as an autograd function: the gradient goes back
// along the same routes, the splits swapped, and every rank joins that
// exchange even when its output got no gradient (it then sends zeros on
// x's device, in x's dtype). The hook's collectives; exposed for tests.
at::Tensor AllToAllWithGrad(const at::Tensor& x, ExpertExchange* exchange,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv);

// The hook. E must be a multiple of the exchange's size. Not owned: the
// exchange outlives it.
class ExpertParallel final : public model::ExpertsHook {
 public:
  explicit ExpertParallel(ExpertExchange* exchange) : exchange_(exchange) {}
  int ranks() const override { return exchange_->size(); }
  // One all-to-all of M counts per pair of ranks, on the device.
  at::Tensor ExchangeCounts(const at::Tensor& counts_E) override;
  at::Tensor Run(const at::Tensor& rows_SD, const std::vector<int64_t>& counts,
                 const std::vector<int64_t>& received, const LocalExperts& local) override;

 private:
  ExpertExchange* exchange_;
};

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_EXPERT_PARALLEL_H_
