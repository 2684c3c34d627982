// PEM files named by flags (tallyd's --tls_cert/--tls_key/--client_ca and
// --metrics_tls_*, tally-worker's --ca_cert/--tls_cert/--tls_key): read with
// a size limit, checked with OpenSSL, every error INVALID_ARGUMENT beginning
// "--FLAG: " and naming the path. An encrypted key is refused, never
// prompted for.
#ifndef TALLY_COMMON_PEM_H_
#define TALLY_COMMON_PEM_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

inline constexpr size_t kMaxPemFileBytes = size_t{1} << 20;

// The bytes of the file at `path`, at most `max_bytes`; INVALID_ARGUMENT
// with the reason alone otherwise ("No such file or directory", "larger than
// N bytes"), for the caller to name the file.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

// ReadSmallFile of at most kMaxPemFileBytes; "--FLAG: cannot read PATH: why"
// otherwise. `flag` is given without dashes ("tls_cert").
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path);

// OK when `pem` holds at least one certificate.
absl::Status CheckPemCertificates(absl::string_view flag, const std::string& path,
                                  const std::string& pem);

// OK when `cert_pem`'s first certificate and `key_pem`'s private key are a pair.
absl::Status CheckPemKeyPair(absl::string_view cert_flag, const std::string& cert_path,
                             const std::string& cert_pem, absl::string_view key_flag,
                             const std::string& key_path, const std::string& key_pem);

// The names a PEM certificate carries: its subject CN, then its DNS SANs.
// InvalidArgument when `cert_pem` holds no certificate.
absl::StatusOr<std::vector<std::string>> CertificateNames(const std::string& cert_pem);

}  // namespace tally

#endif  // TALLY_COMMON_PEM_H_
