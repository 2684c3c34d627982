#include "cli/tallyctl/client_config.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/spec_yaml.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "yaml-cpp/yaml.h"

namespace tally::cli {
namespace {

using tally::tallyctl::Config;
using tally::tallyctl::Context;

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", EscapeUnprintable(s), "\""); }

// A file's bytes, at most `max_bytes`. NOT_FOUND when it does not exist;
// INVALID_ARGUMENT for any other failure, naming `what` and the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes,
                                          absl::string_view what) {
  const std::string where = absl::StrCat(what, " ", EscapeUnprintable(path));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat(where, ": cannot read: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::string out;
  char buf[8192];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(where, ": cannot read: ", std::strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": larger than ", max_bytes, " bytes; is this the right file?"));
    }
  }
  close(fd);
  return out;
}

std::optional<std::string> Get(const Environment& env, const std::string& name) {
  std::optional<std::string> v = env(name);
  if (v.has_value() && v->empty()) return std::nullopt;
  return v;
}

// The 1-based line of contexts[index].key (or of the entry itself when `key`
// is empty) in text ParseYamlInto has accepted; 0 when unknown.
int ContextLine(absl::string_view text, int index, const char* key) {
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    const YAML::Node entry = root["contexts"][index];
    const YAML::Node node = key[0] != '\0' && entry[key] ? entry[key] : entry;
    return node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
  } catch (const YAML::Exception&) {
    return 0;
  }
}

std::string At(absl::string_view text, int index, const char* key) {
  const int line = ContextLine(text, index, key);
  return line > 0 ? absl::StrCat(" (line ", line, ")") : std::string();
}

// True when `s` is 1+ printable ASCII characters without spaces.
bool IsPrintableWord(absl::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

std::string KnownContexts(const Config& config) {
  std::vector<std::string> names;
  for (const Context& c : config.contexts()) names.push_back(EscapeUnprintable(c.name()));
  return names.empty() ? std::string("the file has none")
                       : absl::StrCat("known: ", absl::StrJoin(names, ", "));
}

// The folder of `file`, with a trailing '/'; empty for a bare name.
std::string DirOf(absl::string_view file) {
  const size_t slash = file.rfind('/');
  return slash == absl::string_view::npos ? std::string() : std::string(file.substr(0, slash + 1));
}

// A path written in the config file: "~" is $HOME, relative is beside the file.
absl::StatusOr<std::string> ConfigPath(absl::string_view path, absl::string_view config_file,
                                       const Environment& env) {
  ASSIGN_OR_RETURN(std::string expanded, ExpandHome(path, env));
  if (absl::StartsWith(expanded, "/")) return expanded;
  return absl::StrCat(DirOf(config_file), expanded);
}

// OK when `pem` holds at least one X.509 certificate in PEM.
absl::Status CheckPemCertificates(const std::string& pem, absl::string_view where) {
  const std::string fix =
      "; give the CA certificate(s) that signed tallyd's certificate, in PEM "
      "(-----BEGIN CERTIFICATE-----)";
  if (pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no PEM certificate in it", fix));
  }
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory");
  int count = 0;
  bool bad = false;
  while (true) {
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    if (cert == nullptr) {
      // The end of the input reads as PEM_R_NO_START_LINE; anything else is a
      // damaged certificate.
      const unsigned long err = ERR_peek_last_error();
      bad = !(ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE) ||
            count == 0;
      ERR_clear_error();
      break;
    }
    X509_free(cert);
    ++count;
  }
  BIO_free(bio);
  if (bad) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a PEM certificate in it does not parse", fix));
  }
  return absl::OkStatus();
}

// A setting's value and what named it ("--context", "TALLY_CONFIG"); `by`
// is empty for a default, and both are for none.
struct Named {
  std::string value;
  std::string by;
};

// The config file: --config_file, else TALLY_CONFIG, else the default when
// HOME is set (named by nothing); none otherwise.
Named ChooseConfigFile(const ConnectionFlags& flags, const Environment& env) {
  if (!flags.config_file.empty()) return {flags.config_file, "--config_file"};
  if (auto v = Get(env, "TALLY_CONFIG")) return {*v, "TALLY_CONFIG"};
  if (Get(env, "HOME").has_value()) return {"~/.config/tally/config.yaml", ""};
  return {};
}

// The context --context or TALLY_CONTEXT names; none when neither is set.
Named ChooseContext(const ConnectionFlags& flags, const Environment& env) {
  if (!flags.context.empty()) return {flags.context, "--context"};
  if (auto v = Get(env, "TALLY_CONTEXT")) return {*v, "TALLY_CONTEXT"};
  return {};
}

// The config file read and checked; its path expanded in place, and set as
// conn->config_file when it is read. nullopt for no file, which is an error
// when the file was named, or a context was.
absl::StatusOr<std::optional<Config>> LoadConfig(const Environment& env, const Named& context,
                                                 Named* config_file, Connection* conn) {
  if (config_file->value.empty()) {
    if (context.by.empty()) return std::nullopt;
    return absl::InvalidArgumentError(
        absl::StrCat(context.by, " ", Quoted(context.value),
                     ": HOME is not set, so there is no default config file; give --config_file or "
                     "TALLY_CONFIG"));
  }
  absl::StatusOr<std::string> expanded = ExpandHome(config_file->value, env);
  if (!expanded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_file->by, " ", expanded.status().message()));
  }
  config_file->value = *expanded;
  const std::string& config_path = config_file->value;
  absl::StatusOr<std::string> text = ReadSmallFile(
      config_path, kMaxConfigBytes, config_file->by.empty() ? "config file" : config_file->by);
  if (text.ok()) {
    ASSIGN_OR_RETURN(Config config, ParseClientConfig(*text, EscapeUnprintable(config_path)));
    conn->config_file = config_path;
    return std::optional<Config>(std::move(config));
  }
  if (!absl::IsNotFound(text.status())) {
    return absl::InvalidArgumentError(text.status().message());
  }
  if (!config_file->by.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(text.status().message(), "; write the file or unset ", config_file->by));
  }
  if (!context.by.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context.by, " ", Quoted(context.value), ": there is no config file at ",
                     EscapeUnprintable(config_path),
                     " to define it; write one, or point --config_file or TALLY_CONFIG at it"));
  }
  return std::nullopt;
}

// The context of `config` that `context` names, else the one its
// current_context names; nullptr when neither names one.
absl::StatusOr<const Context*> FindContext(const std::optional<Config>& config,
                                           absl::string_view config_path, Named context) {
  if (context.by.empty() && config.has_value() && !config->current_context().empty()) {
    context = {config->current_context(), "current_context"};
  }
  if (context.value.empty()) return nullptr;
  const Config none;
  const Config& file = config.has_value() ? *config : none;
  const Context* ctx = nullptr;
  for (const Context& c : file.contexts()) {
    if (c.name() == context.value) ctx = &c;
  }
  if (ctx == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        EscapeUnprintable(config_path), ": ", context.by, " ", Quoted(context.value),
        " names no context in the file (", KnownContexts(file), "); ",
        context.by == "current_context" ? "fix current_context, or choose one with "
                                          "--context"
                                        : "choose one of those"));
  }
  return ctx;
}

// The context the settings below fall back on.
struct ChosenContext {
  const Context* ctx = nullptr;  // nullptr: none
  std::string config_path;       // its file, which relative paths are beside
  std::string in_context;        // "context \"NAME\" of PATH", for messages
};

// `path`, or its error prefixed with `source`, where the path came from.
absl::StatusOr<std::string> PathFrom(absl::string_view source, absl::StatusOr<std::string> path) {
  if (!path.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", path.status().message()));
  }
  return path;
}

// conn->address and address_source: --controller, TALLY_CONTROLLER, the
// context, the default.
absl::Status ResolveAddress(const ConnectionFlags& flags, const Environment& env,
                            const ChosenContext& chosen, Connection* conn) {
  if (!flags.controller.empty()) {
    conn->address = flags.controller;
    conn->address_source = "--controller";
  } else if (auto v = Get(env, "TALLY_CONTROLLER")) {
    conn->address = *v;
    conn->address_source = "TALLY_CONTROLLER";
  } else if (chosen.ctx != nullptr) {
    conn->address = chosen.ctx->address();
    conn->address_source = chosen.in_context;
  } else {
    conn->address = kDefaultController;
  }
  if (!IsPrintableWord(conn->address)) {
    return absl::InvalidArgumentError(
        absl::StrCat(conn->address_source, ": the address ", Quoted(conn->address),
                     " has a space or an unprintable character; give host:port"));
  }
  return absl::OkStatus();
}

// The TLS roots (conn->ca_cert_*): --ca_cert, TALLY_CA_CERT, the context's
// ca_cert, or none; read and checked to hold PEM certificates.
absl::Status ResolveCaCert(const ConnectionFlags& flags, const Environment& env,
                           const ChosenContext& chosen, Connection* conn) {
  std::string ca_path;
  if (!flags.ca_cert.empty()) {
    ca_path = flags.ca_cert;
    conn->ca_cert_source = "--ca_cert";
  } else if (auto v = Get(env, "TALLY_CA_CERT")) {
    ca_path = *v;
    conn->ca_cert_source = "TALLY_CA_CERT";
  } else if (chosen.ctx != nullptr && !chosen.ctx->ca_cert().empty()) {
    conn->ca_cert_source = absl::StrCat(chosen.in_context, ", ca_cert");
    ASSIGN_OR_RETURN(ca_path, PathFrom(conn->ca_cert_source,
                                       ConfigPath(chosen.ctx->ca_cert(), chosen.config_path, env)));
  }
  if (ca_path.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(conn->ca_cert_path, PathFrom(conn->ca_cert_source, ExpandHome(ca_path, env)));
  const std::string where =
      absl::StrCat(conn->ca_cert_source, " ", EscapeUnprintable(conn->ca_cert_path));
  absl::StatusOr<std::string> pem =
      ReadSmallFile(conn->ca_cert_path, kMaxCaCertBytes, conn->ca_cert_source);
  if (!pem.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        pem.status().message(),
        absl::IsNotFound(pem.status()) ? "; give the CA certificate file (PEM)" : ""));
  }
  RETURN_IF_ERROR(CheckPemCertificates(*pem, where));
  conn->ca_cert_pem = *std::move(pem);
  return absl::OkStatus();
}

// The name checked in tallyd's certificate: --tls_server_name (which needs
// TLS roots), else the context's when there are roots.
absl::Status ResolveTlsServerName(const ConnectionFlags& flags, const ChosenContext& chosen,
                                  Connection* conn) {
  if (!flags.tls_server_name.empty()) {
    if (!IsPrintableWord(flags.tls_server_name)) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_server_name ",
                                                     Quoted(flags.tls_server_name),
                                                     " has a space or an unprintable character"));
    }
    if (conn->ca_cert_pem.empty()) {
      return absl::InvalidArgumentError(
          "--tls_server_name is set without TLS roots; the name is checked only over TLS, so "
          "also give --ca_cert (or TALLY_CA_CERT, or a context with ca_cert)");
    }
    conn->tls_server_name = flags.tls_server_name;
  } else if (chosen.ctx != nullptr && !conn->ca_cert_pem.empty()) {
    conn->tls_server_name = chosen.ctx->tls_server_name();
  }
  return absl::OkStatus();
}

// The token (conn->token, token_source): --token, --token_file, TALLY_TOKEN,
// the context's token_file, or none; checked to be sendable.
absl::Status ResolveToken(const ConnectionFlags& flags, const Environment& env,
                          const ChosenContext& chosen, Connection* conn) {
  if (!flags.token.empty() && !flags.token_file.empty()) {
    return absl::InvalidArgumentError("--token and --token_file are both set; give one");
  }
  std::string token_path;
  if (!flags.token.empty()) {
    conn->token = flags.token;
    conn->token_source = "--token";
  } else if (!flags.token_file.empty()) {
    token_path = flags.token_file;
    conn->token_source = "--token_file";
  } else if (auto v = Get(env, "TALLY_TOKEN")) {
    conn->token = *v;
    conn->token_source = "TALLY_TOKEN";
  } else if (chosen.ctx != nullptr && !chosen.ctx->token_file().empty()) {
    conn->token_source = absl::StrCat(chosen.in_context, ", token_file");
    ASSIGN_OR_RETURN(token_path,
                     PathFrom(conn->token_source,
                              ConfigPath(chosen.ctx->token_file(), chosen.config_path, env)));
  }
  if (!token_path.empty()) {
    ASSIGN_OR_RETURN(const std::string path,
                     PathFrom(conn->token_source, ExpandHome(token_path, env)));
    absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxTokenBytes + 64, conn->token_source);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(text.status().message(),
                       absl::IsNotFound(text.status())
                           ? "; give the file holding the token (tallyctl token create prints one)"
                           : ""));
    }
    conn->token_source = absl::StrCat(conn->token_source, " ", EscapeUnprintable(path));
    conn->token = std::string(absl::StripAsciiWhitespace(*text));
  }
  if (!conn->token_source.empty()) {
    RETURN_IF_ERROR(CheckToken(conn->token, conn->token_source));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ExpandHome(absl::string_view path, const Environment& env) {
  if (!absl::StartsWith(path, "~")) return std::string(path);
  if (path.size() > 1 && path[1] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(path),
                     ": only ~ and ~/ are expanded (to $HOME), not ~user; "
                     "write the full path"));
  }
  const std::optional<std::string> home = Get(env, "HOME");
  if (!home.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(path), ": HOME is not set, so ~ means nothing; write the full path"));
  }
  return absl::StrCat(absl::StripSuffix(*home, "/"), path.substr(1));
}

absl::Status CheckToken(absl::string_view token, absl::string_view source) {
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the token is empty; give the token tallyctl token create made"));
  }
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the token is ", token.size(),
                                                   " bytes, over the limit of ", kMaxTokenBytes,
                                                   "; is this the right file?"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = token[i];
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the token has a space, control or non-ASCII character at byte ", i + 1, " of ",
          token.size(), "; a token is printable ASCII without spaces (one per file)"));
    }
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::string_view host = address;
  absl::ConsumePrefix(&host, "dns:///");
  absl::ConsumePrefix(&host, "ipv4:");
  absl::ConsumePrefix(&host, "ipv6:");
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (absl::EqualsIgnoreCase(host, "localhost") || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (absl::string_view p : parts) {
    int v;
    if (!absl::SimpleAtoi(p, &v) || v < 0 || v > 255) return false;
  }
  return true;
}

absl::StatusOr<Config> ParseClientConfig(absl::string_view text, absl::string_view source) {
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": larger than ", kMaxConfigBytes, " bytes; is this the right file?"));
  }
  Config config;
  if (absl::Status s = ParseYamlInto(text, &config, ""); !s.ok()) {
    // An unknown field's message lists the fields already.
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", s.message(),
        absl::StrContains(s.message(), " has: ")
            ? ""
            : " (the file holds current_context and a list of contexts, each with name, "
              "address and optionally ca_cert, token_file, tls_server_name)"));
  }
  for (int i = 0; i < config.contexts_size(); ++i) {
    const Context& c = config.contexts(i);
    const std::string path = absl::StrCat(source, ": contexts[", i, "]");
    if (c.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, At(text, i, ""), ": name is required; give each context a name"));
    }
    if (!IsPrintableWord(c.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".name", At(text, i, "name"), ": ", Quoted(c.name()),
                       " has a space or an unprintable character; use a plain word"));
    }
    for (int j = 0; j < i; ++j) {
      if (config.contexts(j).name() == c.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ".name", At(text, i, "name"), ": ", Quoted(c.name()),
                         " is also the name of contexts[", j, "]", At(text, j, "name"),
                         "; context names must be unique, rename or remove one"));
      }
    }
    const std::string named = absl::StrCat(path, " (", Quoted(c.name()), ")");
    if (c.address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, At(text, i, ""),
                       ": address is required; give tallyd's host:port, e.g. "
                       "tally.example.com:50051"));
    }
    if (!IsPrintableWord(c.address())) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, ".address", At(text, i, "address"), ": ", Quoted(c.address()),
                       " has a space or an unprintable character; give host:port"));
    }
    if (!c.tls_server_name().empty() && c.ca_cert().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, ".tls_server_name", At(text, i, "tls_server_name"),
          ": set without ca_cert; the name is checked only over TLS, so add ca_cert or "
          "remove tls_server_name"));
    }
    if (!c.tls_server_name().empty() && !IsPrintableWord(c.tls_server_name())) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, ".tls_server_name", At(text, i, "tls_server_name"), ": ",
                       Quoted(c.tls_server_name()), " has a space or an unprintable character"));
    }
  }
  return config;
}

absl::StatusOr<Connection> ResolveConnection(const ConnectionFlags& flags, const Environment& env) {
  Connection conn;
  Named config_file = ChooseConfigFile(flags, env);
  const Named context = ChooseContext(flags, env);
  ASSIGN_OR_RETURN(const std::optional<Config> config,
                   LoadConfig(env, context, &config_file, &conn));
  ChosenContext chosen{.config_path = config_file.value};
  ASSIGN_OR_RETURN(chosen.ctx, FindContext(config, chosen.config_path, context));
  if (chosen.ctx != nullptr) {
    conn.context = chosen.ctx->name();
    chosen.in_context = absl::StrCat("context ", Quoted(chosen.ctx->name()), " of ",
                                     EscapeUnprintable(chosen.config_path));
  }
  RETURN_IF_ERROR(ResolveAddress(flags, env, chosen, &conn));
  RETURN_IF_ERROR(ResolveCaCert(flags, env, chosen, &conn));
  RETURN_IF_ERROR(ResolveTlsServerName(flags, chosen, &conn));
  RETURN_IF_ERROR(ResolveToken(flags, env, chosen, &conn));
  return conn;
}

}  // namespace tally::cli
