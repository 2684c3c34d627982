// BF16 autocast scoped to a region of code, as Python's torch.autocast
// context manager scopes it.
//
// ATen keeps the BF16 copy of every FP32 leaf weight that requires grad in a
// process-wide cache from the first autocast product that casts it until
// at::autocast::clear_cache() runs; Python's context manager clears it when
// its outermost region exits. A trainer that turns autocast on once and never
// clears the cache computes every later step with the weights as they were
// when first cast (and, if that first cast happened under no_grad, with no
// gradient reaching them at all). AutocastRegion is that context manager in
// C++: it turns autocast on for the device with BF16, counts its nesting,
// and clears the cache when the outermost region ends, then puts the
// previous autocast state back.
//
// The trainer opens one region per optimizer step (every micro-batch's
// forward and backward inside it, so each weight is cast once per step and
// reused across micro-batches) and one per evaluation pass. Autocast state is
// per thread: a region covers the thread that opened it. Not copyable.
#ifndef TALLY_WORKER_PRECISION_AUTOCAST_H_
#define TALLY_WORKER_PRECISION_AUTOCAST_H_

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace tally::precision {

class AutocastRegion {
 public:
  // enabled false: nothing happens (the region is a no-op), so callers can
  // open one unconditionally.
  AutocastRegion(c10::DeviceType device, bool enabled);
  ~AutocastRegion();
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
};

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_AUTOCAST_H_
