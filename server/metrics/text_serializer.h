// Prometheus text exposition format 0.0.4: the only code that knows it.
#ifndef TALLY_SERVER_METRICS_TEXT_SERIALIZER_H_
#define TALLY_SERVER_METRICS_TEXT_SERIALIZER_H_

#include <string>
#include <vector>

#include "server/metrics/registry.h"

namespace tally::metrics {

inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::string SerializeText(const std::vector<MetricFamily>& families);

// Label values escape backslash, double quote and newline.
std::string EscapeLabelValue(const std::string& value);

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_TEXT_SERIALIZER_H_
