// Serves a Registry as GET /metrics over HTTP (civetweb), plus /healthz.
#ifndef TALLY_SERVER_METRICS_HTTP_EXPORTER_H_
#define TALLY_SERVER_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics/registry.h"

struct mg_context;

namespace tally::metrics {

class HttpExporter {
 public:
  // `listen` is "host:port"; port 0 picks a free one (see port()).
  // `registry` must outlive the exporter.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(
      const std::string& listen, const Registry* registry);
  ~HttpExporter();

  int port() const { return port_; }
  const Registry* registry() const { return registry_; }

 private:
  HttpExporter(const Registry* registry) : registry_(registry) {}
  const Registry* registry_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_HTTP_EXPORTER_H_
