#include "server/api/tls_files.h"

#include "absl/status/statusor.h"
#include "common/pem.h"
#include "common/status_macros.h"

namespace tally::api {

absl::Status CheckTlsFiles(const std::string& cert, const std::string& key, const std::string& ca,
                           const TlsFileFlags& flags) {
  ASSIGN_OR_RETURN(std::string cert_pem, ReadFlagFile(flags.cert, cert));
  RETURN_IF_ERROR(CheckPemCertificates(flags.cert, cert, cert_pem));
  ASSIGN_OR_RETURN(std::string key_pem, ReadFlagFile(flags.key, key));
  RETURN_IF_ERROR(CheckPemKeyPair(flags.cert, cert, cert_pem, flags.key, key, key_pem));
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(std::string ca_pem, ReadFlagFile(flags.ca, ca));
    RETURN_IF_ERROR(CheckPemCertificates(flags.ca, ca, ca_pem));
  }
  return absl::OkStatus();
}

}  // namespace tally::api
