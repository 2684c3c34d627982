#include "server/api/stream_limiter.h"

#include <grpcpp/server_context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tally::api {

std::string PrincipalOfPeer(absl::string_view peer) {
  const bool ip = absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:");
  if (!ip) return std::string(peer);
  absl::string_view addr = peer.substr(5);
  // gRPC writes IPv6 hosts in brackets, percent-encoded in newer releases.
  std::string decoded =
      absl::StrReplaceAll(addr, {{"%5B", "["}, {"%5D", "]"}, {"%3A", ":"}, {"%25", "%"}});
  if (absl::StartsWith(decoded, "[")) {
    const size_t close = decoded.find(']');
    if (close != std::string::npos) return decoded.substr(1, close - 1);
    return decoded;
  }
  const size_t colon = decoded.rfind(':');
  return colon == std::string::npos ? decoded : decoded.substr(0, colon);
}

std::string PeerPrincipal(const grpc::ServerContextBase& context) {
  return PrincipalOfPeer(context.peer());
}

StreamLimiter::Lease& StreamLimiter::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    limiter_ = std::exchange(other.limiter_, nullptr);
    principal_ = std::move(other.principal_);
  }
  return *this;
}

void StreamLimiter::Lease::Release() {
  if (limiter_ != nullptr) std::exchange(limiter_, nullptr)->Release(principal_);
}

absl::StatusOr<StreamLimiter::Lease> StreamLimiter::Acquire(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  if (options_.max_total > 0 && total_ >= options_.max_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tallyd has ", total_, " ", options_.what, " open, its limit (--",
        options_.total_flag, "=", options_.max_total,
        "); retry later, or raise --", options_.total_flag));
  }
  auto held = per_principal_.find(principal);
  if (options_.max_total > 0 && options_.reserved > 0 && held != per_principal_.end() &&
      total_ >= options_.max_total - options_.reserved) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tallyd has ", total_, " ", options_.what, " open; its last ", options_.reserved,
        " of ", options_.max_total, " (--", options_.reserved_flag, ", --", options_.total_flag,
        ") are kept for callers that hold none, and ", principal, " holds ", held->second,
        "; close some, or retry later"));
  }
  int64_t& mine = per_principal_[principal];
  if (options_.max_per_principal > 0 && mine >= options_.max_per_principal) {
    const int64_t open = mine;
    if (mine == 0) per_principal_.erase(principal);
    return absl::ResourceExhaustedError(absl::StrCat(
        principal, " has ", open, " ", options_.what, " open, the limit per caller (--",
        options_.per_principal_flag, "=", options_.max_per_principal,
        "); close some, or raise --", options_.per_principal_flag));
  }
  ++mine;
  ++total_;
  return Lease(this, principal);
}

void StreamLimiter::Release(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  auto it = per_principal_.find(principal);
  if (it == per_principal_.end()) return;
  --total_;
  if (--it->second == 0) per_principal_.erase(it);
}

int64_t StreamLimiter::num_open() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

int64_t StreamLimiter::num_open(const std::string& principal) const {
  absl::MutexLock lock(&mu_);
  auto it = per_principal_.find(principal);
  return it == per_principal_.end() ? 0 : it->second;
}

}  // namespace tally::api
