#include "server/metrics/text_serializer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tally::metrics {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  // The shortest of %.15g..%.17g that reads back as the same double.
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendLabels(std::string* out, const Labels& labels,
                  const std::string* le = nullptr) {
  if (labels.empty() && le == nullptr) return;
  *out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(out, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
    first = false;
  }
  if (le != nullptr) absl::StrAppend(out, first ? "" : ",", "le=\"", *le, "\"");
  *out += '}';
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string SerializeText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const auto& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelp(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", TypeName(f.type), "\n");
    for (const auto& m : f.metric) {
      if (f.type == MetricType::kHistogram) {
        for (const auto& [bound, count] : m.buckets) {
          const std::string le = FormatValue(bound);
          absl::StrAppend(&out, f.name, "_bucket");
          AppendLabels(&out, m.labels, &le);
          absl::StrAppend(&out, " ", count, "\n");
        }
        absl::StrAppend(&out, f.name, "_sum");
        AppendLabels(&out, m.labels);
        absl::StrAppend(&out, " ", FormatValue(m.sample_sum), "\n");
        absl::StrAppend(&out, f.name, "_count");
        AppendLabels(&out, m.labels);
        absl::StrAppend(&out, " ", m.sample_count, "\n");
      } else {
        out += f.name;
        AppendLabels(&out, m.labels);
        absl::StrAppend(&out, " ", FormatValue(m.value), "\n");
      }
    }
  }
  return out;
}

}  // namespace tally::metrics
