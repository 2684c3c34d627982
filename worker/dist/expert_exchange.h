// Expert parallelism (model/moe.h) over a process group.
#ifndef TALLY_WORKER_DIST_EXPERT_EXCHANGE_H_
#define TALLY_WORKER_DIST_EXPERT_EXCHANGE_H_

#include <vector>

#include "worker/dist/group.h"
#include "worker/model/moe.h"

namespace tally::dist {

class GroupExchange final : public model::ExpertExchange {
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

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_EXPERT_EXCHANGE_H_
