#include "server/metrics/tls_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A P-256 key and a self-signed certificate for it, as PEM files.
struct Pem {
  std::string cert;
  std::string key;
};

Pem MakeSelfSigned(const std::filesystem::path& dir, const std::string& name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("tallyd"), -1, -1, 0);
  X509_set_issuer_name(x, subject);
  X509_sign(x, key, EVP_sha256());
  Pem pem{(dir / (name + ".pem")).string(), (dir / (name + ".key")).string()};
  FILE* f = std::fopen(pem.cert.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(pem.key.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  return pem;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{15, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `request` over TLS, trusting only `ca`, and returns all the server
// sent back; "handshake failed" when the server could not be verified.
std::string TlsExchange(int port, const std::string& ca, const std::string& request) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = Connect(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string out;
  if (SSL_connect(ssl) != 1) {
    out = "handshake failed";
  } else {
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) out.append(buf, n);
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return out;
}

class TlsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tls_server_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    pem_ = MakeSelfSigned(dir_, "server");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static TlsServer::Response Handle(absl::string_view path) {
    TlsServer::Response r;
    if (path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4";
      r.body = "tally_up 1\n";
    } else {
      r.status = 404;
    }
    return r;
  }

  std::filesystem::path dir_;
  Pem pem_;
};

TEST_F(TlsServerTest, ServesGetAndHeadOverTlsOnAPickedPort) {
  auto server = TlsServer::Start("127.0.0.1:0", pem_.cert, pem_.key, Handle);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  const std::string get =
      TlsExchange(port, pem_.cert, "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_THAT(get, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(get, HasSubstr("Content-Type: text/plain; version=0.0.4\r\n"));
  EXPECT_THAT(get, HasSubstr("Content-Length: 11\r\n"));
  EXPECT_THAT(get, HasSubstr("\r\n\r\ntally_up 1\n"));

  const std::string head = TlsExchange(port, pem_.cert, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, Not(HasSubstr("tally_up")));

  EXPECT_THAT(TlsExchange(port, pem_.cert, "GET /other HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 404 Not Found\r\n"));
  const std::string post = TlsExchange(port, pem_.cert, "POST /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD\r\n"));
  EXPECT_THAT(TlsExchange(port, pem_.cert, "nonsense\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(TlsExchange(port, pem_.cert,
                          "GET /metrics HTTP/1.1\r\nX: " +
                              std::string(TlsServer::kMaxRequestHeadBytes, 'a')),
              StartsWith("HTTP/1.1 431 "));
}

TEST_F(TlsServerTest, PlainHttpAndAnotherTrustAnchorGetNothing) {
  auto server = TlsServer::Start("127.0.0.1:0", pem_.cert, pem_.key, Handle);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  EXPECT_THAT(out, Not(HasSubstr("tally_up")));
  EXPECT_THAT(out, Not(HasSubstr("200 OK")));

  const Pem other = MakeSelfSigned(dir_, "other");
  EXPECT_EQ(TlsExchange((*server)->port(), other.cert, "GET /metrics HTTP/1.1\r\n\r\n"),
            "handshake failed");
}

TEST_F(TlsServerTest, AnIdleConnectionHoldsNoOtherClientAndStopsWithTheServer) {
  auto server = TlsServer::Start("127.0.0.1:0", pem_.cert, pem_.key, Handle);
  ASSERT_TRUE(server.ok()) << server.status();
  const int idle = Connect((*server)->port());
  ASSERT_GE(idle, 0);
  EXPECT_THAT(TlsExchange((*server)->port(), pem_.cert, "GET /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  // The destructor ends the idle connection instead of waiting it out.
  server->reset();
  char c;
  EXPECT_EQ(read(idle, &c, 1), 0);
  close(idle);
}

TEST_F(TlsServerTest, RefusesFilesThatDoNotLoadOrMatch) {
  const Pem other = MakeSelfSigned(dir_, "other");
  auto mismatched = TlsServer::Start("127.0.0.1:0", pem_.cert, other.key, Handle);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("is not the private key"));
  EXPECT_THAT(mismatched.status().message(), HasSubstr(other.key));

  const std::string junk = (dir_ / "junk.pem").string();
  FILE* f = std::fopen(junk.c_str(), "w");
  std::fputs("not a certificate\n", f);
  std::fclose(f);
  auto not_pem = TlsServer::Start("127.0.0.1:0", junk, pem_.key, Handle);
  ASSERT_FALSE(not_pem.ok());
  EXPECT_THAT(not_pem.status().message(), HasSubstr(junk));
  auto missing_key = TlsServer::Start("127.0.0.1:0", pem_.cert, "/nonexistent/k.pem", Handle);
  ASSERT_FALSE(missing_key.ok());
  EXPECT_THAT(missing_key.status().message(), HasSubstr("/nonexistent/k.pem"));
}

TEST_F(TlsServerTest, AnAddressInUseIsUnavailable) {
  auto first = TlsServer::Start("127.0.0.1:0", pem_.cert, pem_.key, Handle);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = TlsServer::Start("127.0.0.1:" + std::to_string((*first)->port()), pem_.cert,
                                 pem_.key, Handle);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics_listen"));
}

}  // namespace
}  // namespace tally::metrics
