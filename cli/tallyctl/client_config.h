// How tallyctl reaches tallyd: the address, whether to use TLS and with which
// roots, and the bearer token, resolved from flags, environment variables and
// a config file of named contexts, like kubeconfig:
//
//   current_context: prod
//   contexts:
//     - name: prod
//       address: tally.example.com:50051
//       ca_cert: /etc/tally/ca.pem
//       token_file: ~/.config/tally/prod.token
//     - name: local
//       address: 127.0.0.1:50051
//
// Each setting is taken from the first that has it: a flag, an environment
// variable, the chosen context, the built-in default.
//
//   setting          flag                       environment        context
//   address          --controller               TALLY_CONTROLLER   address
//   TLS roots        --ca_cert                  TALLY_CA_CERT      ca_cert
//   certificate name --tls_server_name          -                  tls_server_name
//   token            --token, --token_file      TALLY_TOKEN        token_file
//   context          --context                  TALLY_CONTEXT      (current_context)
//   config file      --config_file              TALLY_CONFIG       (~/.config/tally/config.yaml)
//
// The address defaults to kDefaultController; without roots the channel is
// plaintext, and without a token no authorization header is sent. A config
// file that does not exist is no error unless it was named (--config_file,
// TALLY_CONFIG) or a context was (--context, TALLY_CONTEXT). A leading "~" in
// any path is $HOME; a relative path in the config file is relative to the
// file's folder.
//
// The config file is read strictly (ParseYamlInto in common/spec_yaml.h: a
// size limit, no anchors or aliases, no unknown fields, no key given twice,
// no wrong types) and every context must have a unique name and an address.
//
// Every error is INVALID_ARGUMENT (tallyctl exits 2), names the flag,
// variable or file (with the field and its line where there is one) and says
// how to fix it. No message ever holds a token's text.
//
// Nothing here keeps state; all functions are thread-safe.
#ifndef TALLY_CLI_TALLYCTL_CLIENT_CONFIG_H_
#define TALLY_CLI_TALLYCTL_CLIENT_CONFIG_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flag_env.h"
#include "tallyctl/client_config.pb.h"

namespace tally::cli {

inline constexpr char kDefaultController[] = "127.0.0.1:50051";
// A real config file is a few hundred bytes.
inline constexpr size_t kMaxConfigBytes = size_t{64} << 10;
// A token goes in one HTTP/2 header.
inline constexpr size_t kMaxTokenBytes = 4096;
// Hundreds of roots fit (a certificate is about 2 KB of PEM).
inline constexpr size_t kMaxCaCertBytes = size_t{1} << 20;

// What the command line gave; an empty string means "not given".
struct ConnectionFlags {
  std::string controller;
  std::string token;
  std::string token_file;
  std::string ca_cert;
  std::string tls_server_name;
  std::string context;
  std::string config_file;
};

// The environment is read through common/flag_env.h's Environment (an
// empty value counts as unset).
using ::tally::Environment;
using ::tally::ProcessEnvironment;

// How to reach tallyd, resolved.
struct Connection {
  std::string address;
  // Where the address came from, e.g. "--controller" or "context \"prod\""
  // (empty for the built-in default).
  std::string address_source;
  // TLS roots: the file and its PEM text. Both empty: a plaintext channel.
  std::string ca_cert_path;
  std::string ca_cert_pem;
  std::string ca_cert_source;   // e.g. "--ca_cert", "TALLY_CA_CERT"
  std::string tls_server_name;  // empty: the address's host is checked
  // The bearer token, already checked to be sendable; empty: none. Never
  // print it.
  std::string token;
  std::string token_source;  // e.g. "TALLY_TOKEN", "--token_file /x/t"
  std::string context;       // the chosen context's name, empty for none
  std::string config_file;   // the config file read, empty when none was
};

// Resolves the connection from `flags`, `env` (which also gives HOME) and the
// config file, reading the files it names (config, token, CA roots).
absl::StatusOr<Connection> ResolveConnection(const ConnectionFlags& flags, const Environment& env);

// Parses config text and checks each context (name given and unique,
// address given, tls_server_name only with ca_cert). `source` names the file
// in messages.
absl::StatusOr<tally::tallyctl::Config> ParseClientConfig(absl::string_view text,
                                                          absl::string_view source);

// OK when `token` can be sent as "authorization: Bearer TOKEN": 1 to
// kMaxTokenBytes of printable ASCII without spaces. The message names
// `source`, never the token.
absl::Status CheckToken(absl::string_view token, absl::string_view source);

// `path` with a leading "~" or "~/" replaced by $HOME; other paths as given.
// INVALID_ARGUMENT when it starts with "~" and HOME is unset, or with "~user".
absl::StatusOr<std::string> ExpandHome(absl::string_view path, const Environment& env);

// Whether the host of "host:port" is loopback (localhost, 127.0.0.0/8,
// ::1): where a token may travel without TLS.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_CLIENT_CONFIG_H_
