// Serves a Registry as GET /metrics, plus /healthz (200 while the process
// runs) and /readyz (200 once SetReady(true), else 503): over plain HTTP
// (civetweb), or over HTTPS (TlsServer, see tls_server.h) when given a
// certificate and key.
#ifndef TALLY_SERVER_METRICS_HTTP_EXPORTER_H_
#define TALLY_SERVER_METRICS_HTTP_EXPORTER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/registry.h"

struct mg_context;

namespace tally::metrics {

class TlsServer;

class HttpExporter {
 public:
  // PEM files of HTTPS: the certificate chain and its (unencrypted) private
  // key, re-read when they change (tls_server.h).
  struct Tls {
    std::string cert_path;
    std::string key_path;
  };

  // `listen` is "host:port"; port 0 picks a free one (see port()).
  // `registry` must outlive the exporter. With `tls`, only HTTPS is served
  // on that port; InvalidArgument when its files do not load or match,
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      const std::string& listen, const Registry* registry,
      std::optional<Tls> tls = std::nullopt);
  ~HttpExporter();

  int port() const { return port_; }
  // /readyz answers 200 "ready" when true, 503 "not ready" when false (the
  // initial state). Thread-safe.
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }
  // While `check` returns a reason, /readyz answers 503 "not ready: REASON"
  // even when ready (e.g. the store refuses writes). Called on each /readyz
  // request, on the server's threads; null removes it. Thread-safe.
  void SetReadinessCheck(std::function<std::optional<std::string>()> check);
  // What /readyz answers: 200 "ready\n", or 503 and why not.
  std::pair<int, std::string> Readiness() const;
  const Registry* registry() const { return registry_; }

 private:
  explicit HttpExporter(const Registry* registry);
  const Registry* registry_;
  mg_context* ctx_ = nullptr;
  std::unique_ptr<TlsServer> tls_;
  int port_ = 0;
  std::atomic<bool> ready_{false};
  mutable absl::Mutex check_mu_;
  std::function<std::optional<std::string>()> check_ ABSL_GUARDED_BY(check_mu_);
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_HTTP_EXPORTER_H_
