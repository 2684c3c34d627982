#include "server/wiring/reload.h"

#include <string>
#include <utility>
#include <vector>

#include "server/api/grpc_server_limits.h"
#include "server/api/tls_files.h"
#include "server/wiring/credentials.h"
#include "spdlog/spdlog.h"

namespace tally::wiring {
namespace {

// A bad file fails closed (none of its credentials is accepted until a
// reload reads it); streams they no longer admit end.
void ReloadCredentials(const Reloadable& r) {
  std::vector<std::pair<std::string, std::string>> failed;
  absl::StatusOr<api::Credentials> reloaded_credentials = LoadCredentials(r.options, &failed);
  for (const auto& [flag, error] : failed) {
    spdlog::error("SIGHUP: {}; every credential of --{} is refused until it is fixed and "
                  "tallyd reloaded", error, flag);
    r.credential_reload_failures.Add({{"file", flag}}).Increment();
  }
  if (!reloaded_credentials.ok()) {
    spdlog::error("SIGHUP: {}; keeping the previous credentials",
                  std::string(reloaded_credentials.status().message()));
  } else {
    const int ended = r.gate.Reload(*std::move(reloaded_credentials));
    spdlog::info("SIGHUP: reloaded the token and JWT key files{}; ended {} stream(s) whose "
                 "credential was revoked", failed.empty() ? "" : " (failing closed)", ended);
  }
}

void CheckTls(const config::TallydOptions& o) {
  if (o.tls_cert.empty()) return;
  absl::Status s = api::CheckTlsFiles(o.tls_cert, o.tls_key, o.client_ca);
  if (s.ok()) {
    spdlog::info("SIGHUP: the TLS files are valid; they are served within 5 s of a change");
  } else {
    spdlog::error("SIGHUP: {}; the last valid certificate stays in use", std::string(s.message()));
  }
}

// Prices, quotas, submit limits and priority caps; a bad file keeps the old
// ones.
void ReloadConfig(const Reloadable& r) {
  const std::string& config_path = r.options.config;
  const config::TallydConfig* config = &r.config;
  if (config_path.empty()) {
    spdlog::warn("SIGHUP: no --config to reload");
    return;
  }
  auto reloaded = config::LoadTallydConfig(config_path);
  if (!reloaded.ok()) {
    spdlog::error("SIGHUP: {}; keeping the previous prices",
                  std::string(reloaded.status().message()));
    return;
  }
  r.submit_limiter.SetLimits(reloaded->limits.submits_per_second, reloaded->limits.submit_burst);
  r.priority_caps.Set(reloaded->tenancy);
  if (reloaded->tenancy.cross_tenant_preemption != config->tenancy.cross_tenant_preemption) {
    spdlog::warn("SIGHUP: tenancy.cross_tenant_preemption in {} changed; it is read at start "
                 "only, restart tallyd to apply it", config_path);
  }
  if (api::GrpcServerArgs(reloaded->grpc_server) != api::GrpcServerArgs(config->grpc_server)) {
    spdlog::warn("SIGHUP: grpc_server in {} changed; it is read at start only, restart "
                 "tallyd to apply it", config_path);
  }
  const std::string prices = reloaded->prices.Describe();
  const absl::Status priced = r.core.Run([&](sched::Scheduler& s) {
    s.SetQuotas(reloaded->quotas);
    return s.SetPrices(reloaded->prices);
  });
  if (priced.ok()) {
    spdlog::info("SIGHUP: reloaded {}", prices);
  } else {
    spdlog::error("SIGHUP: {}; keeping the previous prices (send SIGHUP again once the store "
                  "takes writes)", std::string(priced.message()));
  }
}

}  // namespace

void Reload(const Reloadable& r) {
  ReloadCredentials(r);
  CheckTls(r.options);
  ReloadConfig(r);
}

}  // namespace tally::wiring
