#include "server/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <cstdio>
#include <cstdlib>

namespace tally::metrics {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double cur = a.load();
  while (!a.compare_exchange_weak(cur, cur + v)) {
  }
}

}  // namespace

void Counter::Increment(double v) {
  if (v > 0) AtomicAdd(value_, v);
}

ClientMetric Counter::Collect() const {
  ClientMetric m;
  m.value = Value();
  return m;
}

void Gauge::Increment(double v) { AtomicAdd(value_, v); }

ClientMetric Gauge::Collect() const {
  ClientMetric m;
  m.value = Value();
  return m;
}

Histogram::Histogram(BucketBoundaries bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
}

ClientMetric Histogram::Collect() const {
  ClientMetric m;
  absl::MutexLock lock(&mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    m.buckets.emplace_back(i < bounds_.size()
                               ? bounds_[i]
                               : std::numeric_limits<double>::infinity(),
                           cumulative);
  }
  m.sample_count = cumulative;
  m.sample_sum = sum_;
  return m;
}

Histogram::BucketBoundaries Histogram::ExponentialBuckets(double start,
                                                          double factor,
                                                          int count) {
  BucketBoundaries b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

void Registry::AddCollectCallback(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  callbacks_.push_back(std::move(callback));
}

void Registry::Insert(const std::string& name,
                      std::unique_ptr<FamilyBase> family) {
  absl::MutexLock lock(&mu_);
  for (const auto& [n, f] : families_) {
    if (n == name) {
      std::fprintf(stderr, "metric family registered twice: %s\n", name.c_str());
      std::abort();
    }
  }
  families_.emplace_back(name, std::move(family));
}

std::vector<MetricFamily> Registry::Collect() const {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    callbacks = callbacks_;
  }
  for (const auto& cb : callbacks) cb();
  absl::MutexLock lock(&mu_);
  std::vector<MetricFamily> out;
  out.reserve(families_.size());
  for (const auto& [name, family] : families_) out.push_back(family->Collect());
  return out;
}

}  // namespace tally::metrics
