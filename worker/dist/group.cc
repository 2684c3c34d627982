#include "worker/dist/group.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#if defined(TALLY_WITH_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(TALLY_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace tally::dist {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// c10d's flight recorder, one per process, files a group in a std::map
// outside its lock when the group launches its first collective, so two
// groups launching from two threads at once corrupt the map (a crash in
// ProcessGroupGloo::enqueue, seen with ranks run as threads of one test).
// Every Gloo launch holds this lock; waits do not. A worker launches from its
// one trainer thread, so the lock is uncontended there. NCCL launches are
// left alone: a group's first one blocks until every rank has created the
// communicator, and NCCL ranks are processes of their own (one per GPU).
std::mutex launch_mu;

class C10dGroup final : public Group {
 public:
  C10dGroup(c10::intrusive_ptr<c10d::Backend> pg, std::string backend, GroupOptions options,
            c10::intrusive_ptr<c10d::Store> tcp, std::string prefix)
      : pg_(std::move(pg)),
        backend_(std::move(backend)),
        options_(std::move(options)),
        tcp_(std::move(tcp)),
        prefix_(std::move(prefix)),
        // NCCL reduces device tensors only; Gloo host tensors.
        device_(backend_ == "nccl" ? at::Device(options_.device) : at::Device(at::kCPU)) {}

  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }
  std::string backend() const override { return backend_; }

  template <typename F>
  c10::intrusive_ptr<c10d::Work> Launch(F&& launch) {
    if (backend_ == "nccl") return launch();
    std::lock_guard<std::mutex> lock(launch_mu);
    return launch();
  }

  void AllReduceSum(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) override {
    // Buckets of one dtype and device, in the order given.
    struct Bucket {
      std::vector<at::Tensor> members;
      int64_t bytes = 0;
      at::Tensor flat;
      c10::intrusive_ptr<c10d::Work> work;
    };
    std::vector<Bucket> buckets;
    std::map<std::pair<int, int>, size_t> open;  // (dtype, device) -> bucket
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || t.numel() == 0) continue;
      const std::pair<int, int> key{static_cast<int>(t.scalar_type()),
                                    static_cast<int>(t.device().type()) * 256 + t.device().index()};
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      auto it = open.find(key);
      if (it == open.end() || buckets[it->second].bytes + bytes > bucket_bytes) {
        buckets.emplace_back();
        open[key] = buckets.size() - 1;
        it = open.find(key);
      }
      Bucket& b = buckets[it->second];
      b.members.push_back(t);
      b.bytes += bytes;
    }
    Guard([&] {
      for (Bucket& b : buckets) {
        std::vector<at::Tensor> flat_parts;
        for (const at::Tensor& t : b.members) flat_parts.push_back(t.reshape({-1}));
        b.flat = at::cat(flat_parts).to(device_);
        std::vector<at::Tensor> io{b.flat};
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::SUM;
        b.work = Launch([&] { return pg_->allreduce(io, o); });
      }
      for (Bucket& b : buckets) {
        b.work->wait();
        int64_t offset = 0;
        for (const at::Tensor& t : b.members) {
          t.copy_(b.flat.narrow(0, offset, t.numel()).view_as(t));
          offset += t.numel();
        }
      }
    }, "all-reduce");
  }

  std::unique_ptr<Pending> StartAllReduceSum(const at::Tensor& tensor) override {
    class Work final : public Pending {
     public:
      Work(C10dGroup* g, c10::intrusive_ptr<c10d::Work> w) : g_(g), w_(std::move(w)) {}
      void Wait() override {
        g_->Guard([&] { w_->wait(); }, "all-reduce");
      }

     private:
      C10dGroup* g_;
      c10::intrusive_ptr<c10d::Work> w_;
    };
    c10::intrusive_ptr<c10d::Work> w;
    Guard([&] {
      std::vector<at::Tensor> io{tensor};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      w = Launch([&] { return pg_->allreduce(io, o); });
    }, "all-reduce");
    return std::make_unique<Work>(this, std::move(w));
  }

  void AllReduceMax(const at::Tensor& tensor) override {
    Guard([&] {
      std::vector<at::Tensor> io{tensor.to(device_).contiguous()};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::MAX;
      Launch([&] { return pg_->allreduce(io, o); })->wait();
      if (!io[0].is_same(tensor)) tensor.copy_(io[0]);
    }, "all-reduce (max)");
  }

  void Broadcast(const std::vector<at::Tensor>& tensors, int root) override {
    Guard([&] {
      for (const at::Tensor& t : tensors) {
        std::vector<at::Tensor> io{t.to(device_).contiguous()};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        Launch([&] { return pg_->broadcast(io, o); })->wait();
        if (!io[0].is_same(t)) t.copy_(io[0]);
      }
    }, "broadcast");
  }

  void Barrier() override {
    Guard([&] { Launch([&] { return pg_->barrier(); })->wait(); }, "barrier");
  }

  at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv) override {
    int64_t rows = 0;
    for (int64_t n : recv) rows += n;
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] = rows;
    at::Tensor out = at::empty(shape, x.options().device(device_));
    Guard([&] {
      at::Tensor in = x.to(device_).contiguous();
      std::vector<int64_t> out_splits = recv, in_splits = send;
      c10d::AllToAllOptions o;
      Launch([&] { return pg_->alltoall_base(out, in, out_splits, in_splits, o); })->wait();
    }, "all-to-all");
    return out.to(x.device());
  }

  absl::StatusOr<std::unique_ptr<Group>> NewGroup(const std::string& name) override;

 private:
  template <typename F>
  void Guard(F&& f, const char* what) {
    try {
      f();
    } catch (const c10::Error& e) {
      throw CollectiveError(absl::StrCat(backend_, " ", what, " failed on rank ", rank(), " of ",
                                         size(), ": ", FirstLine(e.what_without_backtrace())));
    } catch (const std::exception& e) {
      throw CollectiveError(absl::StrCat(backend_, " ", what, " failed on rank ", rank(), " of ",
                                         size(), ": ", FirstLine(e.what())));
    }
  }

  c10::intrusive_ptr<c10d::Backend> pg_;
  std::string backend_;
  GroupOptions options_;
  c10::intrusive_ptr<c10d::Store> tcp_;
  std::string prefix_;
  at::Device device_;
};

}  // namespace

namespace {

// A process group on `store` for the options' rank and device.
absl::StatusOr<std::unique_ptr<Group>> MakeGroup(const GroupOptions& o,
                                                 c10::intrusive_ptr<c10d::Store> tcp,
                                                 const std::string& prefix);

}  // namespace

absl::StatusOr<std::unique_ptr<Group>> Group::Create(const GroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in a world of size ", o.world_size));
  }
  const size_t colon = o.store_address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(o.store_address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous address \"", o.store_address, "\": want host:port, e.g. 10.0.0.5:29500"));
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = o.rank == 0;
    so.numWorkers = o.world_size;
    so.waitWorkers = true;
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(o.store_address.substr(0, colon), so);
    return MakeGroup(o, tcp, o.prefix);
  } catch (const c10::Error& e) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", o.rank, " of ", o.world_size, " could not join the group at ", o.store_address,
        ": ", FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", o.rank, " of ", o.world_size,
                                               " could not join the group at ",
                                               o.store_address, ": ", FirstLine(e.what())));
  }
}

namespace {

absl::StatusOr<std::unique_ptr<Group>> MakeGroup(const GroupOptions& o,
                                                 c10::intrusive_ptr<c10d::Store> tcp,
                                                 const std::string& prefix) {
  const bool cuda = o.device.rfind("cuda", 0) == 0;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
  if (cuda) {
#if defined(TALLY_WITH_NCCL)
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size, opts);
    return std::unique_ptr<Group>(new C10dGroup(pg, "nccl", o, tcp, prefix));
#else
    return absl::FailedPreconditionError(
        "device " + o.device + ": this build has no NCCL process group (build with "
        "-DTALLY_TORCH_CUDA=ON against a LibTorch with USE_C10D_NCCL)");
#endif
  }
#if defined(TALLY_WITH_GLOO)
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.local_host));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, opts);
  return std::unique_ptr<Group>(new C10dGroup(pg, "gloo", o, tcp, prefix));
#else
  return absl::FailedPreconditionError(
      "this build has no Gloo process group: install Debian's libgloo-dev (its headers) "
      "and reconfigure");
#endif
}

absl::StatusOr<std::unique_ptr<Group>> C10dGroup::NewGroup(const std::string& name) {
  try {
    return MakeGroup(options_, tcp_, prefix_ + "/" + name);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", options_.rank, ": group ", name, ": ",
                                               FirstLine(e.what())));
  }
}

}  // namespace

}  // namespace tally::dist
