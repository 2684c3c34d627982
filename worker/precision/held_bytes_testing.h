// Tests only: how many bytes of CPU memory a piece of code leaves allocated,
// counted through c10's memory-profiling hook (the CPU allocator reports
// every allocation and release to the thread's PROFILER_STATE debug info
// while it says profiling is on). What the autograd graph holds after a
// forward pass, and what a converter keeps in its caches, both show up;
// tensors allocated before the count began do not.
#ifndef TALLY_WORKER_PRECISION_HELD_BYTES_TESTING_H_
#define TALLY_WORKER_PRECISION_HELD_BYTES_TESTING_H_

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

namespace tally::precision::testing {

class HeldBytes final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t,
                         c10::Device device) override {
    if (!device.is_cpu()) return;
    // Releases count only for blocks allocated while counting (the CPU
    // allocator's size table can still hold an older block's size).
    if (alloc_size > 0) {
      sizes_[ptr] = alloc_size;
    } else {
      sizes_.erase(ptr);
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t held() const {
    int64_t n = 0;
    for (const auto& [ptr, size] : sizes_) n += size;
    return n;
  }

 private:
  std::unordered_map<void*, int64_t> sizes_;
};

// Bytes allocated while `f` runs (on this thread, on the CPU) and still
// allocated when it has returned, its locals destroyed.
inline int64_t BytesHeldAfter(const std::function<void()>& f) {
  auto counter = std::make_shared<HeldBytes>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
    f();
  }
  return counter->held();
}

}  // namespace tally::precision::testing

#endif  // TALLY_WORKER_PRECISION_HELD_BYTES_TESTING_H_
