// A small metrics registry mirroring prometheus-cpp's API (Registry, Family,
// Counter, Gauge, Histogram and the Build* builders), which Debian does not
// package. Only text_serializer.h knows the exposition format.
//
// Thread-safety: everything here is thread-safe. Metric objects returned by
// Family::Add stay valid until Family::Remove or the registry is destroyed.
#ifndef TALLY_SERVER_METRICS_REGISTRY_H_
#define TALLY_SERVER_METRICS_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace tally::metrics {

using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

// A collected sample: what the serializer writes.
struct ClientMetric {
  Labels labels;
  double value = 0;  // counter and gauge
  // Histogram: cumulative counts per upper bound (the last is +Inf).
  std::vector<std::pair<double, uint64_t>> buckets;
  uint64_t sample_count = 0;
  double sample_sum = 0;
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type;
  std::vector<ClientMetric> metric;
};

class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;
  // Negative increments are ignored: counters only go up.
  void Increment(double v = 1.0);
  double Value() const { return value_.load(); }
  ClientMetric Collect() const;

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;
  void Set(double v) { value_.store(v); }
  void Increment(double v = 1.0);
  double Value() const { return value_.load(); }
  ClientMetric Collect() const;

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;
  using BucketBoundaries = std::vector<double>;
  // `bounds` must be sorted ascending; +Inf is implied.
  explicit Histogram(BucketBoundaries bounds);
  void Observe(double v);
  ClientMetric Collect() const;

  static BucketBoundaries ExponentialBuckets(double start, double factor,
                                             int count);

 private:
  BucketBoundaries bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket + Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual MetricFamily Collect() const = 0;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, Labels constant_labels)
      : name_(std::move(name)),
        help_(std::move(help)),
        constant_labels_(std::move(constant_labels)) {}

  // Returns the metric with these labels, creating it with `args` if new.
  template <typename... Args>
  T& Add(const Labels& labels, Args&&... args) {
    absl::MutexLock lock(&mu_);
    auto& slot = metrics_[labels];
    if (!slot) slot = std::make_unique<T>(std::forward<Args>(args)...);
    return *slot;
  }
  // Removes the metric with these labels, if there is one.
  void Remove(const Labels& labels) {
    absl::MutexLock lock(&mu_);
    metrics_.erase(labels);
  }
  void Remove(T* metric) {
    absl::MutexLock lock(&mu_);
    for (auto it = metrics_.begin(); it != metrics_.end(); ++it) {
      if (it->second.get() == metric) {
        metrics_.erase(it);
        return;
      }
    }
  }
  bool Has(const Labels& labels) const {
    absl::MutexLock lock(&mu_);
    return metrics_.count(labels) > 0;
  }
  MetricFamily Collect() const override {
    absl::MutexLock lock(&mu_);
    MetricFamily f{name_, help_, T::kType, {}};
    for (const auto& [labels, metric] : metrics_) {
      ClientMetric m = metric->Collect();
      m.labels = labels;
      m.labels.insert(constant_labels_.begin(), constant_labels_.end());
      f.metric.push_back(std::move(m));
    }
    return f;
  }

 private:
  const std::string name_;
  const std::string help_;
  const Labels constant_labels_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> metrics_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  // Registers a family; a second family with the same name is a programming
  // error and aborts.
  template <typename T>
  Family<T>& Add(const std::string& name, const std::string& help,
                 const Labels& constant_labels) {
    auto family = std::make_unique<Family<T>>(name, help, constant_labels);
    Family<T>& ref = *family;
    Insert(name, std::move(family));
    return ref;
  }
  // Runs before every Collect(), e.g. to refresh gauges from a store.
  void AddCollectCallback(std::function<void()> callback);
  std::vector<MetricFamily> Collect() const;

 private:
  void Insert(const std::string& name, std::unique_ptr<FamilyBase> family);
  mutable absl::Mutex mu_;
  std::vector<std::pair<std::string, std::unique_ptr<FamilyBase>>> families_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
class Builder {
 public:
  Builder& Name(const std::string& name) {
    name_ = name;
    return *this;
  }
  Builder& Help(const std::string& help) {
    help_ = help;
    return *this;
  }
  Builder& Labels(const metrics::Labels& labels) {
    labels_ = labels;
    return *this;
  }
  Family<T>& Register(Registry& registry) {
    return registry.Add<T>(name_, help_, labels_);
  }

 private:
  std::string name_, help_;
  metrics::Labels labels_;
};

inline Builder<Counter> BuildCounter() { return {}; }
inline Builder<Gauge> BuildGauge() { return {}; }
inline Builder<Histogram> BuildHistogram() { return {}; }

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_REGISTRY_H_
