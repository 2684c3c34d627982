#include "server/metrics/tls_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace tally::metrics {
namespace {

using SteadyClock = std::chrono::steady_clock;
using CtxPtr = std::shared_ptr<SSL_CTX>;

// An accepted connection waiting for a worker thread.
struct Queued {
  int fd = -1;
  CtxPtr ctx;
  std::chrono::steady_clock::time_point accepted;
};

// OpenSSL's queued errors for this thread, oldest first.
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no reason given" : out;
}

absl::StatusOr<CtxPtr> LoadContext(const std::string& cert, const std::string& key) {
  ERR_clear_error();
  CtxPtr ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("TLS: cannot make a context: ", OpenSslErrors()));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  // An encrypted key fails to load instead of prompting on the terminal.
  SSL_CTX_set_default_passwd_cb(ctx.get(), [](char*, int, int, void*) { return 0; });
  // The key first: a certificate that does not match it then leaves no key,
  // which the check below reports as a mismatch.
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the PEM private key ", key,
                     " (an encrypted key is not supported): ", OpenSslErrors()));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the PEM certificate chain ", cert, ": ", OpenSslErrors()));
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, " is not the private key of the certificate in ", cert, ": ", OpenSslErrors()));
  }
  return ctx;
}

// What tells a renewed file from the one loaded: inode, size and mtime of
// both (stat follows the symlinks a mounted Kubernetes secret swaps).
std::string Fingerprint(const std::string& cert, const std::string& key) {
  std::string out;
  for (const std::string* path : {&cert, &key}) {
    struct stat st;
    if (stat(path->c_str(), &st) != 0) {
      absl::StrAppend(&out, "missing;");
      continue;
    }
    absl::StrAppend(&out, st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                    st.st_mtim.tv_nsec, ";");
  }
  return out;
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace

class TlsServer::Impl {
 public:
  Impl(std::string cert, std::string key, Handler handler, CtxPtr ctx)
      : cert_(std::move(cert)),
        key_(std::move(key)),
        handler_(std::move(handler)),
        ctx_(std::move(ctx)),
        fingerprint_(Fingerprint(cert_, key_)),
        next_check_(SteadyClock::now() + kReloadCheckInterval) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    // The pipe stays readable: every poll below sees it and gives up.
    if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : workers_) t.join();
    absl::MutexLock lock(&mu_);
    for (Queued& q : queue_) close(q.fd);
    if (listen_fd_ >= 0) close(listen_fd_);
    for (int fd : wake_) {
      if (fd >= 0) close(fd);
    }
  }

  absl::Status Listen(const std::string& listen) {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: expected host:port, got \"", listen, "\""));
    }
    std::string host = listen.substr(0, colon);
    const std::string port = listen.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("--metrics_listen: cannot resolve ", listen, ": ", gai_strerror(rc)));
    }
    std::string why = "no address";
    for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        why = std::strerror(errno);
        continue;
      }
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
        why = std::strerror(errno);
        close(fd);
        continue;
      }
      listen_fd_ = fd;
    }
    freeaddrinfo(found);
    if (listen_fd_ < 0) {
      return absl::UnavailableError(
          absl::StrCat("--metrics_listen: cannot listen on ", listen, ": ", why,
                       " (address in use or malformed; use host:port, port 0 for any)"));
    }
    sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      if (addr.ss_family == AF_INET) {
        port_ = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
      } else if (addr.ss_family == AF_INET6) {
        port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
      }
    }
    if (pipe2(wake_, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("cannot make a pipe: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  void StartThreads() {
    acceptor_ = std::thread([this] { AcceptLoop(); });
    for (int i = 0; i < kNumThreads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  int port() const { return port_; }

 private:
  // Acceptor thread only: a renewed certificate, once its files change and
  // load; otherwise the one in use.
  CtxPtr CurrentContext() {
    const auto now = SteadyClock::now();
    if (now < next_check_) return ctx_;
    next_check_ = now + kReloadCheckInterval;
    std::string fingerprint = Fingerprint(cert_, key_);
    if (fingerprint == fingerprint_) return ctx_;
    absl::StatusOr<CtxPtr> loaded = LoadContext(cert_, key_);
    // A half-written pair fails to load: retried at the next check.
    if (loaded.ok()) {
      ctx_ = *std::move(loaded);
      fingerprint_ = std::move(fingerprint);
    }
    return ctx_;
  }

  void AcceptLoop() {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    while (true) {
      const int r = poll(fds, 2, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 || fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: let connections finish instead of spinning.
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        continue;
      }
      CtxPtr ctx = CurrentContext();
      absl::MutexLock lock(&mu_);
      if (queue_.size() >= kMaxQueuedConnections) {
        close(fd);
        continue;
      }
      queue_.push_back({fd, std::move(ctx), SteadyClock::now()});
    }
  }

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  void WorkerLoop() {
    // A peer that hangs up makes writes raise SIGPIPE; here they fail
    // with EPIPE instead (the signal stays pending on this thread only).
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (true) {
      Queued item;
      {
        absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::HasWork));
        if (stopping_) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      Serve(item.fd, item.ctx.get(), item.accepted);
      close(item.fd);
    }
  }

  // Until `fd` is readable (or writable), the deadline passes or the
  // server stops.
  bool Wait(int fd, bool write, SteadyClock::time_point deadline) const {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      if (left.count() <= 0) return false;
      pollfd fds[2] = {{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0},
                       {wake_[0], POLLIN, 0}};
      const int r = poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
      if (r < 0 && errno == EINTR) continue;
      return r > 0 && fds[1].revents == 0;
    }
  }

  // The handshake and the request head must arrive within kHeadDeadline of
  // the accept (time spent queued counts), the whole exchange within
  // kConnectionDeadline: a client that connects and stays silent holds a
  // thread for at most kHeadDeadline.
  void Serve(int fd, SSL_CTX* ctx, SteadyClock::time_point accepted) {
    auto deadline = accepted + kHeadDeadline;
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx), SSL_free);
    if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) return;
    // Runs one non-blocking OpenSSL call to completion: > 0, or <= 0 when it
    // failed, the deadline passed or the server stops.
    auto run = [&](auto call) {
      while (true) {
        ERR_clear_error();
        const int r = call();
        if (r > 0) return r;
        const int err = SSL_get_error(ssl.get(), r);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return -1;
        if (!Wait(fd, err == SSL_ERROR_WANT_WRITE, deadline)) return -1;
      }
    };
    if (run([&] { return SSL_accept(ssl.get()); }) <= 0) return;

    std::string head;
    int status = 0;
    while (head.find("\r\n\r\n") == std::string::npos) {
      if (head.size() > kMaxRequestHeadBytes) {
        status = 431;
        break;
      }
      char buf[2048];
      const int n = run([&] { return SSL_read(ssl.get(), buf, sizeof(buf)); });
      if (n <= 0) return;
      head.append(buf, n);
    }
    deadline = accepted + kConnectionDeadline;
    Response response;
    bool head_only = false;
    std::string allow;
    if (status == 0) {
      const std::string line = head.substr(0, head.find("\r\n"));
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 3 || parts[1].empty() || parts[1][0] != '/' ||
          !absl::StartsWith(parts[2], "HTTP/1.")) {
        status = 400;
      } else if (parts[0] != "GET" && parts[0] != "HEAD") {
        status = 405;
        allow = "Allow: GET, HEAD\r\n";
      } else {
        head_only = parts[0] == "HEAD";
        response = handler_(parts[1].substr(0, parts[1].find('?')));
        status = response.status;
      }
    }
    if (status != 200 && response.body.empty()) {
      response.content_type = "text/plain";
      response.body = absl::StrCat(Reason(status), "\n");
    }
    std::string out = absl::StrCat(
        "HTTP/1.1 ", status, " ", Reason(status), "\r\nContent-Type: ", response.content_type,
        "\r\nContent-Length: ", response.body.size(), "\r\n", allow, "Connection: close\r\n\r\n");
    if (!head_only) out += response.body;
    for (size_t at = 0; at < out.size();) {
      const int chunk = static_cast<int>(std::min<size_t>(out.size() - at, INT_MAX));
      const int n = run([&] { return SSL_write(ssl.get(), out.data() + at, chunk); });
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
    // close_notify, best effort: the client has read a complete response.
    ERR_clear_error();
    SSL_shutdown(ssl.get());
  }

  const std::string cert_;
  const std::string key_;
  const Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  std::vector<std::thread> workers_;

  // The acceptor thread's own.
  CtxPtr ctx_;
  std::string fingerprint_;
  SteadyClock::time_point next_check_;

  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<TlsServer>> TlsServer::Start(const std::string& listen,
                                                            const std::string& cert_path,
                                                            const std::string& key_path,
                                                            Handler handler) {
  absl::StatusOr<CtxPtr> ctx = LoadContext(cert_path, key_path);
  if (!ctx.ok()) return ctx.status();
  auto impl = std::make_unique<Impl>(cert_path, key_path, std::move(handler), *std::move(ctx));
  if (absl::Status s = impl->Listen(listen); !s.ok()) return s;
  impl->StartThreads();
  return std::unique_ptr<TlsServer>(new TlsServer(std::move(impl)));
}

TlsServer::TlsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsServer::~TlsServer() = default;

int TlsServer::port() const { return impl_->port(); }

}  // namespace tally::metrics
