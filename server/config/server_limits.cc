#include "server/config/server_limits.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace tally::config {
namespace {

// gRPC takes its durations as an int of milliseconds.
constexpr absl::Duration kMaxGrpcDuration = absl::Hours(24 * 24);

absl::Status Range(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": must be between ", lo, " and ", hi, ", got ", v));
  }
  return absl::OkStatus();
}

absl::Status DurationRange(const std::string& key, absl::Duration v, absl::Duration lo,
                           absl::Duration hi, bool zero_ok) {
  if ((zero_ok && v == absl::ZeroDuration()) || (v >= lo && v <= hi)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      key, ": must be between ", absl::FormatDuration(lo), " and ", absl::FormatDuration(hi),
      zero_ok ? " (or 0s: no limit)" : "", ", got ", absl::FormatDuration(v)));
}

// One key of a section: its name ("grpc_server.max_frame_bytes (line 3)")
// and a parsed value, or InvalidArgument naming it.
struct Field {
  std::string where;
  const YAML::Node& value;

  absl::Status Int(int64_t* out) const {
    try {
      const double d = value.as<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": must be a whole number"));
      }
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a number"));
    }
  }
  absl::Status Double(double* out) const {
    try {
      *out = value.as<double>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a number"));
    }
    if (!std::isfinite(*out)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": must be a finite number"));
    }
    return absl::OkStatus();
  }
  absl::Status Bool(bool* out) const {
    try {
      *out = value.as<bool>();
      return absl::OkStatus();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": must be true or false"));
    }
  }
  absl::Status Duration(absl::Duration* out) const {
    std::string text;
    try {
      text = value.as<std::string>();
    } catch (const YAML::Exception&) {
      text.clear();
    }
    if (text == "0") text = "0s";
    if (text.empty() || !absl::ParseDuration(text, out) || *out < absl::ZeroDuration() ||
        *out == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": must be a duration such as 500ms, 10s, 15m or 1h"));
    }
    return absl::OkStatus();
  }
};

using Setter = std::function<absl::Status(const Field&)>;

absl::Status ParseSection(const char* section, const YAML::Node& node, int line,
                          const std::map<std::string, Setter>& keys) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(section, " (line ", line, "): expected a mapping of key to value"));
  }
  std::map<std::string, bool> seen;
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const std::string where =
        absl::StrCat(section, ".", key, " (line ", entry.first.Mark().line + 1, ")");
    auto it = keys.find(key);
    if (it == keys.end()) {
      std::string known;
      for (const auto& [k, unused] : keys) absl::StrAppend(&known, known.empty() ? "" : ", ", k);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown key; expected one of ", known));
    }
    if (seen[key]) return absl::InvalidArgumentError(absl::StrCat(where, ": given twice"));
    seen[key] = true;
    if (absl::Status s = it->second(Field{where, entry.second}); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GrpcServerLimits::Validate() const {
  const std::string p = "grpc_server.";
  constexpr int64_t kMaxInt = 0x7fffffff;
  if (auto s = Range(p + "max_metadata_bytes", max_metadata_bytes, 1024, 1 << 20); !s.ok()) {
    return s;
  }
  // RFC 9113 6.5.2: SETTINGS_MAX_FRAME_SIZE is 2^14 to 2^24-1.
  if (auto s = Range(p + "max_frame_bytes", max_frame_bytes, 16384, 16777215); !s.ok()) return s;
  if (auto s = Range(p + "max_concurrent_streams", max_concurrent_streams, 1, kMaxInt); !s.ok()) {
    return s;
  }
  if (auto s = Range(p + "max_receive_message_bytes", max_receive_message_bytes, 1024, kMaxInt);
      !s.ok()) {
    return s;
  }
  if (auto s = Range(p + "max_ping_strikes", max_ping_strikes, 0, 1000); !s.ok()) return s;
  const struct {
    const char* key;
    absl::Duration value;
    absl::Duration lo;
    bool zero_ok;
  } durations[] = {
      {"max_connection_idle", max_connection_idle, absl::Seconds(1), true},
      {"max_connection_age", max_connection_age, absl::Seconds(1), true},
      {"max_connection_age_grace", max_connection_age_grace, absl::ZeroDuration(), false},
      {"keepalive_time", keepalive_time, absl::Seconds(10), false},
      {"keepalive_timeout", keepalive_timeout, absl::Seconds(1), false},
      {"min_client_ping_interval", min_client_ping_interval, absl::ZeroDuration(), false},
      {"handshake_timeout", handshake_timeout, absl::Milliseconds(100), false},
  };
  for (const auto& d : durations) {
    if (auto s = DurationRange(p + d.key, d.value, d.lo, kMaxGrpcDuration, d.zero_ok); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status PrincipalLimits::Validate() const {
  if (!std::isfinite(submits_per_second) || submits_per_second < 0 ||
      submits_per_second > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limits.submits_per_second: must be between 0 (no limit) and 1000000, got ",
        submits_per_second));
  }
  if (submits_per_second > 0) {
    return Range("limits.submit_burst", submit_burst, 1, 1000000);
  }
  return absl::OkStatus();
}

absl::Status ParseGrpcServerLimits(const YAML::Node& node, int line, GrpcServerLimits* out) {
  auto integer = [](int64_t* v) { return [v](const Field& f) { return f.Int(v); }; };
  auto duration = [](absl::Duration* v) { return [v](const Field& f) { return f.Duration(v); }; };
  const std::map<std::string, Setter> keys = {
      {"max_metadata_bytes", integer(&out->max_metadata_bytes)},
      {"max_frame_bytes", integer(&out->max_frame_bytes)},
      {"max_concurrent_streams", integer(&out->max_concurrent_streams)},
      {"max_receive_message_bytes", integer(&out->max_receive_message_bytes)},
      {"max_connection_idle", duration(&out->max_connection_idle)},
      {"max_connection_age", duration(&out->max_connection_age)},
      {"max_connection_age_grace", duration(&out->max_connection_age_grace)},
      {"keepalive_time", duration(&out->keepalive_time)},
      {"keepalive_timeout", duration(&out->keepalive_timeout)},
      {"min_client_ping_interval", duration(&out->min_client_ping_interval)},
      {"max_ping_strikes", integer(&out->max_ping_strikes)},
      {"permit_keepalive_without_calls",
       [out](const Field& f) { return f.Bool(&out->permit_keepalive_without_calls); }},
      {"handshake_timeout", duration(&out->handshake_timeout)},
  };
  if (absl::Status s = ParseSection("grpc_server", node, line, keys); !s.ok()) return s;
  return out->Validate();
}

absl::Status ParsePrincipalLimits(const YAML::Node& node, int line, PrincipalLimits* out) {
  const std::map<std::string, Setter> keys = {
      {"submits_per_second",
       [out](const Field& f) { return f.Double(&out->submits_per_second); }},
      {"submit_burst", [out](const Field& f) { return f.Int(&out->submit_burst); }},
  };
  if (absl::Status s = ParseSection("limits", node, line, keys); !s.ok()) return s;
  return out->Validate();
}

}  // namespace tally::config
