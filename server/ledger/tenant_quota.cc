#include "server/ledger/tenant_quota.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text.h"

namespace tally::ledger {

int64_t TenantSpend::HourOf(absl::Time t) {
  return static_cast<int64_t>(std::floor(absl::ToDoubleSeconds(t - absl::UnixEpoch()) / 3600));
}

void TenantSpend::Add(const std::string& tenant, int64_t hour, double usd) {
  if (!(usd > 0) || !std::isfinite(usd)) return;
  usd_[tenant][hour] += usd;
}

double TenantSpend::Window(const std::string& tenant, absl::Time now,
                           absl::Duration window) const {
  auto it = usd_.find(tenant);
  if (it == usd_.end()) return 0;
  const int64_t last = HourOf(now);
  const int64_t first = last - absl::ToInt64Hours(window) + 1;
  double sum = 0;
  for (auto b = it->second.lower_bound(first); b != it->second.end() && b->first <= last; ++b) {
    sum += b->second;
  }
  return sum;
}

void TenantSpend::Prune(absl::Time now) {
  const int64_t first = HourOf(now) - absl::ToInt64Hours(kQuotaMonth) + 1;
  for (auto it = usd_.begin(); it != usd_.end();) {
    auto& buckets = it->second;
    buckets.erase(buckets.begin(), buckets.lower_bound(first));
    it = buckets.empty() ? usd_.erase(it) : std::next(it);
  }
}

std::vector<std::string> TenantSpend::Tenants() const {
  std::vector<std::string> out;
  for (const auto& [tenant, buckets] : usd_) out.push_back(tenant);
  return out;
}

std::optional<QuotaStop> CheckDollarQuota(const std::string& tenant, const TenantQuotas& quotas,
                                          const TenantSpend& spend, absl::Time now,
                                          double extra_usd) {
  auto q = quotas.find(tenant);
  if (q == quotas.end()) return std::nullopt;
  const struct {
    const char* key;
    double limit;
    absl::Duration window;
    const char* span;
  } windows[] = {
      {"max_dollars_per_day", q->second.max_dollars_per_day, kQuotaDay, "the last 24 hours"},
      {"max_dollars_per_month", q->second.max_dollars_per_month, kQuotaMonth, "the last 30 days"},
  };
  for (const auto& w : windows) {
    if (w.limit <= 0) continue;
    const double spent = spend.Window(tenant, now, w.window) + std::max(0.0, extra_usd);
    if (spent < w.limit) continue;
    QuotaStop stop;
    stop.reason = absl::StrCat("tenant quota: ", tenant, " spent ", FormatDollars(spent),
                               " in ", w.span, ", its ", w.key, " is ", FormatDollars(w.limit));
    stop.detail = absl::StrCat("tenants.", tenant, ".", w.key,
                               " in tallyd's --config; the window rolls by the hour");
    stop.limit = w.key;
    return stop;
  }
  return std::nullopt;
}

}  // namespace tally::ledger
