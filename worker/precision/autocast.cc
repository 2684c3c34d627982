#include "worker/precision/autocast.h"

#include <ATen/autocast_mode.h>

namespace tally::precision {

AutocastRegion::AutocastRegion(c10::DeviceType device, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastRegion::~AutocastRegion() {
  if (!enabled_) return;
  // The outermost region: no cached cast may outlive it (the weights change
  // at the next optimizer step).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
}

}  // namespace tally::precision
