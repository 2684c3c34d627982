#include "server/metrics/http_exporter.h"

#include <civetweb.h>

#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "server/metrics/text_serializer.h"
#include "server/metrics/tls_server.h"

namespace tally::metrics {
namespace {

int HandleMetrics(mg_connection* conn, void* data) {
  const auto* exporter = static_cast<const HttpExporter*>(data);
  const std::string body = SerializeText(exporter->registry()->Collect());
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            kTextContentType, body.size());
  mg_write(conn, body.data(), body.size());
  return 200;
}

int HandleHealth(mg_connection* conn, void*) {
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
            "3\r\nConnection: close\r\n\r\nok\n");
  return 200;
}

int HandleReady(mg_connection* conn, void* data) {
  const auto* exporter = static_cast<const HttpExporter*>(data);
  const auto [status, body] = exporter->Readiness();
  mg_printf(conn,
            "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            status == 200 ? "200 OK" : "503 Service Unavailable", body.size());
  mg_write(conn, body.data(), body.size());
  return status;
}

}  // namespace

void HttpExporter::SetReadinessCheck(std::function<std::optional<std::string>()> check) {
  absl::MutexLock lock(&check_mu_);
  check_ = std::move(check);
}

std::pair<int, std::string> HttpExporter::Readiness() const {
  if (!ready()) return {503, "not ready\n"};
  std::optional<std::string> why_not;
  {
    absl::MutexLock lock(&check_mu_);
    if (check_) why_not = check_();
  }
  if (why_not.has_value()) return {503, absl::StrCat("not ready: ", *why_not, "\n")};
  return {200, "ready\n"};
}

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(
    const std::string& listen, const Registry* registry, std::optional<Tls> tls) {
  std::unique_ptr<HttpExporter> exporter(new HttpExporter(registry));
  if (tls.has_value()) {
    const HttpExporter* self = exporter.get();
    auto server = TlsServer::Start(
        listen, tls->cert_path, tls->key_path, [registry, self](absl::string_view path) {
          TlsServer::Response r;
          if (path == "/metrics") {
            r.content_type = kTextContentType;
            r.body = SerializeText(registry->Collect());
          } else if (path == "/healthz") {
            r.body = "ok\n";
          } else if (path == "/readyz") {
            std::tie(r.status, r.body) = self->Readiness();
          } else {
            r.status = 404;
          }
          return r;
        });
    if (!server.ok()) return server.status();
    exporter->port_ = (*server)->port();
    exporter->tls_ = *std::move(server);
    return exporter;
  }
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", "4",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  exporter->ctx_ = mg_start(&callbacks, nullptr, options);
  if (exporter->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics_listen: cannot listen on ", listen,
        " (address in use or malformed; use host:port, port 0 for any)"));
  }
  mg_set_request_handler(exporter->ctx_, "/metrics", HandleMetrics,
                         exporter.get());
  mg_set_request_handler(exporter->ctx_, "/healthz", HandleHealth, nullptr);
  mg_set_request_handler(exporter->ctx_, "/readyz", HandleReady, exporter.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(exporter->ctx_, 4, ports);
  if (n > 0) exporter->port_ = ports[0].port;
  return exporter;
}

HttpExporter::HttpExporter(const Registry* registry) : registry_(registry) {}

HttpExporter::~HttpExporter() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

}  // namespace tally::metrics
