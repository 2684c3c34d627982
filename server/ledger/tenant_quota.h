// Tenant quotas, in money and GPUs: the spend cap of a team.
//
// tallyd's --config may give each tenant
//   max_gpus               GPUs its running jobs may hold at once (0: no limit)
//   max_dollars_per_day    dollars over the last 24 hours (0: no limit)
//   max_dollars_per_month  dollars over the last 30 days (0: no limit)
// Windows roll on tallyd's clock at hour resolution: spend is kept per tenant
// and hour (committed with the job change that accrued it), and a window
// sums the hour buckets it covers, the current one included.
//
// Pure; not thread-safe (the scheduler serialises calls).
#ifndef TALLY_SERVER_LEDGER_TENANT_QUOTA_H_
#define TALLY_SERVER_LEDGER_TENANT_QUOTA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tally::ledger {

struct TenantQuota {
  int32_t max_gpus = 0;
  double max_dollars_per_day = 0;
  double max_dollars_per_month = 0;
};
using TenantQuotas = std::map<std::string, TenantQuota>;

inline constexpr absl::Duration kQuotaDay = absl::Hours(24);
inline constexpr absl::Duration kQuotaMonth = absl::Hours(24 * 30);

// Dollars per tenant and hour (hours since the Unix epoch).
class TenantSpend {
 public:
  static int64_t HourOf(absl::Time t);

  void Add(const std::string& tenant, int64_t hour, double usd);
  // The tenant's dollars in the `window` ending at `now` (whole hours; the
  // current hour's bucket included).
  double Window(const std::string& tenant, absl::Time now, absl::Duration window) const;
  // Forgets buckets older than a month before `now`.
  void Prune(absl::Time now);
  std::vector<std::string> Tenants() const;

 private:
  std::map<std::string, std::map<int64_t, double>> usd_;
};

// Why a tenant may not spend more.
struct QuotaStop {
  std::string reason;  // "tenant quota: research spent $X of max_dollars_per_day $Y ..."
  std::string detail;
  std::string limit;   // "max_dollars_per_day" or "max_dollars_per_month"
};

// Set when `tenant`'s spend over a day or a month, with `extra_usd` not yet
// committed, has reached its quota. Nothing for a tenant without one.
std::optional<QuotaStop> CheckDollarQuota(const std::string& tenant, const TenantQuotas& quotas,
                                          const TenantSpend& spend, absl::Time now,
                                          double extra_usd = 0);

}  // namespace tally::ledger

#endif  // TALLY_SERVER_LEDGER_TENANT_QUOTA_H_
