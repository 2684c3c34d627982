// A small HTTPS server for the exporter's GET endpoints (/metrics, /healthz):
// one request per connection ("Connection: close"), TLS 1.2 or newer with
// OpenSSL linked at build time.
//
// Why not civetweb's TLS: Debian's civetweb 1.15 loads libssl.so at run time
// and looks up SSL_get_peer_certificate, which OpenSSL 3 no longer exports;
// the lookup is left empty and its first TLS connection calls a null
// pointer (civetweb issue #1334). It also needs libssl.so and libcrypto.so,
// the -dev symlinks, which a runtime image does not have.
//
// Hostile clients: from its accept (time queued included) a connection has
// kHeadDeadline for the handshake and the request head, of at most
// kMaxRequestHeadBytes, and kConnectionDeadline in all; a few
// worker threads serve connections, and accepted connections beyond
// kMaxQueuedConnections are closed at once.
//
// Renewal: the certificate and key files are re-read when their
// modification times change (checked at most every kReloadCheckInterval,
// when a connection arrives); a pair that fails to load keeps the previous
// one in use.
//
// Thread-safety: Start and the destructor from one thread; the handler is
// called from the worker threads, concurrently.
#ifndef TALLY_SERVER_METRICS_TLS_SERVER_H_
#define TALLY_SERVER_METRICS_TLS_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally::metrics {

class TlsServer {
 public:
  struct Response {
    int status = 200;  // 200, 404 or 503
    std::string content_type = "text/plain";
    std::string body;
  };
  // Called for GET and HEAD with the path (the query string removed).
  using Handler = std::function<Response(absl::string_view path)>;

  static constexpr std::chrono::seconds kConnectionDeadline{10};
  static constexpr std::chrono::seconds kHeadDeadline{2};
  static constexpr size_t kMaxRequestHeadBytes = 8192;
  static constexpr int kNumThreads = 4;
  static constexpr size_t kMaxQueuedConnections = 64;
  static constexpr std::chrono::seconds kReloadCheckInterval{5};

  // Listens on `listen` ("host:port", "[v6]:port"; port 0 picks one) with the
  // PEM certificate chain `cert_path` and its PEM private key `key_path`.
  // InvalidArgument when the files do not load or do not match (naming the
  // paths and OpenSSL's reason); Unavailable when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<TlsServer>> Start(const std::string& listen,
                                                          const std::string& cert_path,
                                                          const std::string& key_path,
                                                          Handler handler);
  // Stops accepting and waits for the connections being served (each ends
  // within kConnectionDeadline).
  ~TlsServer();

  int port() const;

  class Impl;

 private:
  explicit TlsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_TLS_SERVER_H_
