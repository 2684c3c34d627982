#include "cli/tallyctl/experiment_report.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace tally::cli {
namespace {

using ::tally::v1::EvalPoint;
using ::tally::v1::Experiment;
using ::tally::v1::VariantStatus;

// Losses and costs beyond this are corrupt; keeping them out also keeps every
// span and tick computation below finite.
constexpr double kMaxMagnitude = 1e100;

constexpr int kWidth = 880;
constexpr int kMinHeight = 480;
constexpr double kPlotLeft = 84;
constexpr double kPlotTop = 70;
constexpr double kPlotWidth = 520;
constexpr double kPlotHeight = 340;
constexpr double kLegendLeft = kPlotLeft + kPlotWidth + 28;
constexpr double kLegendRow = 34;
constexpr size_t kMaxTitleChars = 90;
constexpr size_t kMaxNameChars = 28;
constexpr size_t kMaxDetailChars = 34;
constexpr int kTargetTicks = 5;

// Tableau 10: distinct hues that stay apart on white.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

bool Plottable(double v) { return std::isfinite(v) && std::abs(v) <= kMaxMagnitude; }

// The loss plotted: the experiment's target.metric's (the quantized loss
// with quantized_val_loss; NaN, so not plotted, where a point has none).
double Loss(const EvalPoint& p, bool quantized) {
  if (!quantized) return p.val_loss();
  return p.has_quantized_val_loss() ? p.quantized_val_loss()
                                    : std::numeric_limits<double>::quiet_NaN();
}

bool ByQuantized(const Experiment& e) { return e.spec().target().metric() == "quantized_val_loss"; }

// Decodes one UTF-8 character at the front of `text` into `cp` and returns
// its length, or returns 0 when the bytes there are not valid UTF-8 (bad
// lead byte, truncated or bad continuation, overlong form, surrogate, or past
// U+10FFFF).
size_t DecodeUtf8(absl::string_view text, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t len;
  uint32_t value;
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    value = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    value = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(i) & 0x3F);
  }
  if ((len == 3 && value < 0x800) || (len == 4 && (value < 0x10000 || value > 0x10FFFF)) ||
      (value >= 0xD800 && value <= 0xDFFF)) {
    return 0;
  }
  *cp = value;
  return len;
}

// Characters XML 1.0 forbids, or that would make the text read differently
// from its bytes (C0/C1 controls, DEL, bidirectional overrides).
bool Unshowable(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xFFFE || cp == 0xFFFF || cp == 0x2028 ||
         cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

// `text` as XML character data, fit for element content and for attribute
// values in double or single quotes: invalid UTF-8 and unshowable characters
// become U+FFFD, markup characters become entities, and text past
// `max_chars` characters is cut and ends in an ellipsis.
std::string Xml(absl::string_view text, size_t max_chars = kMaxTitleChars) {
  std::string out;
  size_t chars = 0;
  while (!text.empty()) {
    if (chars == max_chars) {
      out += "\u2026";
      break;
    }
    uint32_t cp = 0;
    size_t len = DecodeUtf8(text, &cp);
    if (len == 0 || Unshowable(cp)) {
      out += "\uFFFD";
      len = len == 0 ? 1 : len;
    } else {
      switch (cp) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        case '\'':
          out += "&apos;";
          break;
        default:
          out.append(text.data(), len);
      }
    }
    text.remove_prefix(len);
    ++chars;
  }
  return out;
}

// A coordinate in the image, to two decimals (always finite: the axes map
// bounded values into the plot).
std::string Px(double v) { return absl::StrFormat("%.2f", v); }

struct Axis {
  double lo = 0;
  double hi = 1;
  double step = 0.2;
  int num_steps = 5;
};

// Linear axis covering [lo, hi] (hi > lo) with about kTargetTicks steps of
// 1, 2 or 5 times a power of ten, its ends on ticks.
Axis NiceAxis(double lo, double hi) {
  const double raw = (hi - lo) / kTargetTicks;
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / base;
  const double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  Axis axis;
  axis.step = nice * base;
  axis.lo = std::floor(lo / axis.step) * axis.step;
  axis.hi = std::ceil(hi / axis.step) * axis.step;
  axis.num_steps = std::clamp(static_cast<int>(std::lround((axis.hi - axis.lo) / axis.step)), 1,
                              4 * kTargetTicks);
  axis.hi = axis.lo + axis.num_steps * axis.step;
  return axis;
}

// True when [lo, hi] is too narrow (relative to its values) for ticks.
bool Degenerate(double lo, double hi) {
  return !(hi - lo > 1e-9 * std::max(std::abs(lo), std::abs(hi)));
}

// A number for a person to read: three significant figures or so, with an
// SI suffix (k, M, G, T, P, E) from 10,000 on.
std::string Si(double v) {
  const double mag = std::abs(v);
  if (mag >= 1e21 || mag < 1) return absl::StrFormat("%.3g", v);
  if (mag < 1e4) return absl::StrFormat("%.*f", mag >= 100 ? 0 : 2, v);
  const int group = std::clamp(static_cast<int>(std::floor(std::log10(mag) / 3)), 1, 6);
  const double scaled = v / std::pow(1000.0, group);
  const double scaled_mag = std::abs(scaled);
  return absl::StrFormat("%.*f%c",
                         scaled_mag < 10    ? 2
                         : scaled_mag < 100 ? 1
                                            : 0,
                         scaled, "kMGTPE"[group - 1]);
}

std::string Dollars(double v) { return absl::StrCat(v < 0 ? "-$" : "$", Si(std::abs(v))); }

// The label of tick `v` on `axis`: as many decimals as the step needs, with
// an SI suffix when the axis reaches 10,000.
std::string TickLabel(double v, const Axis& axis, bool dollars) {
  const double mag = std::max(std::abs(axis.lo), std::abs(axis.hi));
  if (std::abs(v) < axis.step * 1e-6) return dollars ? "$0" : "0";
  std::string number;
  if (mag >= 1e21) {
    number = absl::StrFormat("%.3g", std::abs(v));
  } else {
    const int group =
        mag >= 1e4 ? std::clamp(static_cast<int>(std::floor(std::log10(mag) / 3)), 1, 6) : 0;
    const double scale = std::pow(1000.0, group);
    const int decimals =
        std::clamp(static_cast<int>(std::ceil(-std::log10(axis.step / scale) - 1e-9)), 0, 12);
    number = absl::StrFormat("%.*f", decimals, std::abs(v) / scale);
    if (group > 0) number += "kMGTPE"[group - 1];
  }
  return absl::StrCat(v < 0 ? "-" : "", dollars ? "$" : "", number);
}

struct Point {
  double x;
  double y;
};

// One legend entry and, when it has evaluations, one drawn curve.
struct Series {
  std::string name;
  size_t color = 0;
  const VariantStatus* status = nullptr;  // with replicates, its first run's
  const tally::v1::VariantSummary* summary = nullptr;  // with replicates
  const std::vector<EvalPoint>* curve = nullptr;
  std::vector<Point> points;
};

const char* Color(size_t index) { return kPalette[index % kPaletteSize]; }

// Curves past the palette's length repeat its colours, dashed.
std::string DashAttribute(size_t index) {
  return index >= kPaletteSize ? " stroke-dasharray=\"7 4\"" : "";
}

std::string StateWord(const Experiment& experiment) {
  const std::string& full = tally::v1::ExperimentState_Name(experiment.state());
  if (full.empty()) return absl::StrCat("state ", static_cast<int>(experiment.state()));
  std::string name(absl::StripPrefix(full, "EXPERIMENT_STATE_"));
  if (name == "UNSPECIFIED") return "";
  absl::AsciiStrToLower(&name);
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}

std::string Title(const Experiment& experiment) {
  if (!experiment.spec().display_name().empty() && !experiment.name().empty()) {
    return absl::StrCat(Xml(experiment.spec().display_name(), kMaxTitleChars / 2), " (",
                        Xml(experiment.name(), kMaxTitleChars / 2), ")");
  }
  if (!experiment.spec().display_name().empty()) return Xml(experiment.spec().display_name());
  if (!experiment.name().empty()) return Xml(experiment.name());
  return "Experiment";
}

enum class XAxis { kRecipeDollars, kBilledDollars, kTokens };

// Where a variant reached the target on the x axis.
double ToTarget(const VariantStatus& v, XAxis x) {
  switch (x) {
    case XAxis::kTokens:
      return v.tokens_to_target();
    case XAxis::kRecipeDollars:
      return v.recipe_cost_to_target_usd();
    case XAxis::kBilledDollars:
      break;
  }
  return v.cost_to_target_usd();
}

// The legend's second line for a variant: its cost to the target, or why it
// has none.
std::string Detail(const Series& s, double target, XAxis x) {
  const bool tokens = x == XAxis::kTokens;
  std::string detail;
  if (s.points.empty()) {
    detail = s.status != nullptr && !s.status->note().empty()
                 ? Xml(s.status->note(), kMaxDetailChars)
                 : "no evaluations yet";
  } else if (target > 0 && s.status != nullptr && s.status->reached_target()) {
    const double to_target = ToTarget(*s.status, x);
    if (Plottable(to_target)) {
      detail = tokens ? absl::StrCat(Si(to_target), " tokens to target")
                      : absl::StrCat(Dollars(to_target), " to target");
    } else {
      detail = "reached target";
    }
  } else if (target > 0) {
    detail = s.status != nullptr && !s.status->note().empty()
                 ? Xml(s.status->note(), kMaxDetailChars)
                 : "target not reached";
  } else {
    detail = absl::StrFormat("latest loss %.4f", s.points.back().y);
  }
  if (s.summary != nullptr && target > 0 && x == XAxis::kRecipeDollars &&
      s.summary->recipe_cost_to_target_usd() > 0) {
    detail = absl::StrCat("mean ", Dollars(s.summary->recipe_cost_to_target_usd()),
                          " to target, ", s.summary->reached_target(), " of ",
                          s.summary->replicates(), " runs");
  }
  if (s.status != nullptr && s.status->halted()) detail += " (halted)";
  return detail;
}

// The curves to draw, in legend order with their colours: the
// experiment's variants as listed, then any other curve; a name seen twice
// keeps its first place and curve.
std::vector<Series> CollectSeries(const Experiment& experiment,
                                  const std::vector<VariantCurve>& curves) {
  std::vector<Series> series;
  const auto find = [&](absl::string_view name) -> Series* {
    for (Series& s : series) {
      if (s.name == name) return &s;
    }
    return nullptr;
  };
  for (const VariantStatus& v : experiment.variants()) {
    if (find(v.name()) != nullptr) continue;
    Series s;
    s.name = v.name();
    s.color = series.size();
    s.status = &v;
    for (const auto& summary : experiment.summaries()) {
      if (summary.name() == v.name() && summary.replicates() > 1) s.summary = &summary;
    }
    series.push_back(std::move(s));
  }
  for (const VariantCurve& c : curves) {
    Series* s = find(c.variant);
    if (s == nullptr) {
      Series added;
      added.name = c.variant;
      added.color = series.size();
      series.push_back(std::move(added));
      s = &series.back();
    }
    if (s->curve == nullptr) s->curve = &c.curve;
  }
  return series;
}

// The x axis (recipe dollars, billed dollars or tokens) and each series'
// points on it.
XAxis PlaceSeries(const ReportOptions& options, bool quantized, std::vector<Series>* all) {
  std::vector<Series>& series = *all;
  // Dollars on x unless no evaluation has a cost (tallyd has no prices).
  bool any_loss = false;
  bool any_cost = false;
  for (const Series& s : series) {
    if (s.curve == nullptr) continue;
    for (const EvalPoint& p : *s.curve) {
      if (!Plottable(Loss(p, quantized))) continue;
      any_loss = true;
      any_cost = any_cost || (Plottable(p.cost_usd()) && p.cost_usd() > 0);
    }
  }
  const bool tokens = any_loss && !any_cost;
  // Recipe dollars when asked (the default) and every plotted variant has a
  // recipe price per step.
  bool recipe = !tokens && !options.billed;
  for (const Series& s : series) {
    if (s.curve == nullptr || s.curve->empty()) continue;
    recipe = recipe && s.status != nullptr && Plottable(s.status->recipe_usd_per_step()) &&
             s.status->recipe_usd_per_step() > 0;
  }
  const XAxis x_axis = tokens   ? XAxis::kTokens
                       : recipe ? XAxis::kRecipeDollars
                                : XAxis::kBilledDollars;
  for (Series& s : series) {
    if (s.curve == nullptr) continue;
    for (const EvalPoint& p : *s.curve) {
      const double x = x_axis == XAxis::kTokens ? static_cast<double>(p.tokens())
                       : x_axis == XAxis::kRecipeDollars
                           ? static_cast<double>(p.step()) * s.status->recipe_usd_per_step()
                           : p.cost_usd();
      const double loss = Loss(p, quantized);
      if (Plottable(x) && Plottable(loss)) s.points.push_back({x, loss});
    }
  }
  return x_axis;
}

// The legend: each series' colour, name and figures.
void AppendLegend(const std::vector<Series>& series, double target, XAxis x_axis,
                  std::string* out) {
  std::string& svg = *out;
  absl::StrAppend(&svg, "<g class=\"legend\">\n");
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const double y = kPlotTop + 8 + kLegendRow * static_cast<double>(i);
    absl::StrAppend(&svg, "<line x1=\"", Px(kLegendLeft), "\" y1=\"", Px(y), "\" x2=\"",
                    Px(kLegendLeft + 22), "\" y2=\"", Px(y), "\" stroke=\"", Color(s.color),
                    "\" stroke-width=\"3\"", DashAttribute(s.color), "/>\n");
    absl::StrAppend(&svg, "<text class=\"legend-name\" data-variant=\"", Xml(s.name), "\" x=\"",
                    Px(kLegendLeft + 30), "\" y=\"", Px(y + 4), "\">", Xml(s.name, kMaxNameChars),
                    "</text>\n");
    absl::StrAppend(&svg, "<text class=\"legend-detail\" x=\"", Px(kLegendLeft + 30), "\" y=\"",
                    Px(y + 18), "\" font-size=\"10.5\" fill=\"#666666\">",
                    Detail(s, target, x_axis), "</text>\n");
  }
  absl::StrAppend(&svg, "</g>\n");
}

// Where a variant crossed the target, on the x axis.
struct Crossing {
  const Series* series;
  double x;
  // With replicates: the 90% interval of the variant's mean to the target
  // (low = high: none), drawn as a whisker on the target line.
  double low = 0, high = 0;
};

// A whisker on the target line (at y_px) from lo_px to hi_px: the interval
// of `c`'s variant's mean over its replicates.
void AppendInterval(const Crossing& c, double lo_px, double hi_px, double y_px, bool tokens,
                    std::string* svg) {
  const std::string name = Xml(c.series->name);
  const std::string y = Px(y_px), lo = Px(lo_px), hi = Px(hi_px);
  const std::string y0 = Px(y_px - 6), y1 = Px(y_px + 6);
  absl::StrAppend(svg, "<path class=\"interval\" data-variant=\"", name, "\" d=\"M", lo, " ", y,
                  " L", hi, " ", y, " M", lo, " ", y0, " L", lo, " ", y1, " M", hi, " ", y0, " L",
                  hi, " ", y1, "\" fill=\"none\" stroke=\"", Color(c.series->color),
                  "\" stroke-width=\"2\"><title>", name,
                  ": 90% interval of the mean over replicates, ",
                  tokens ? absl::StrCat(Si(c.low), "-", Si(c.high), " tokens")
                         : absl::StrCat(Dollars(c.low), "-", Dollars(c.high)),
                  "</title></path>\n");
}

// The axes, the target line, the curves and the crossings, scaled to what
// there is to draw (zoomed to the target's region when `zoom`).
void AppendPlot(const std::vector<Series>& series, const std::vector<Crossing>& crossings,
                double target, XAxis x_axis, bool zoom, std::string* out) {
  std::string& svg = *out;
  const bool tokens = x_axis == XAxis::kTokens;
  double x_lo = 0, x_hi = 0;
  double y_lo = target > 0 ? target : HUGE_VAL, y_hi = target > 0 ? target : -HUGE_VAL;
  for (const Series& s : series) {
    for (const Point& p : s.points) {
      x_lo = std::min(x_lo, p.x);
      x_hi = std::max(x_hi, p.x);
      y_lo = std::min(y_lo, p.y);
      y_hi = std::max(y_hi, p.y);
    }
  }
  for (const Crossing& c : crossings) {
    x_lo = std::min({x_lo, c.x, c.low < c.high ? c.low : c.x});
    x_hi = std::max({x_hi, c.x, c.high});
  }
  if (Degenerate(x_lo, x_hi)) x_hi = x_lo + std::max(1.0, std::abs(x_lo));
  // The region around the target: what tells the variants apart there
  // (the early, steep part of every curve is alike).
  bool clipped = false;
  if (zoom && target > 0 && y_hi > 1.35 * target) {
    y_hi = 1.35 * target;
    y_lo = std::min(y_lo, target) - 0.02 * target;
    clipped = true;
  }
  if (Degenerate(y_lo, y_hi)) {
    const double pad = y_lo == 0 ? 1 : std::abs(y_lo) * 0.05;
    y_lo -= pad;
    y_hi += pad;
  }
  const Axis ax = NiceAxis(x_lo, x_hi);
  const Axis ay = NiceAxis(y_lo, y_hi);
  const auto px = [&](double x) {
    return kPlotLeft + (x - ax.lo) / (ax.hi - ax.lo) * kPlotWidth;
  };
  const auto py = [&](double y) {
    return kPlotTop + kPlotHeight - (y - ay.lo) / (ay.hi - ay.lo) * kPlotHeight;
  };

  absl::StrAppend(&svg, "<g class=\"x-axis\" font-size=\"11\" text-anchor=\"middle\">\n");
  for (int i = 0; i <= ax.num_steps; ++i) {
    const double v = ax.lo + i * ax.step;
    const std::string x = Px(px(v));
    absl::StrAppend(&svg, "<line x1=\"", x, "\" y1=\"", Px(kPlotTop), "\" x2=\"", x, "\" y2=\"",
                    Px(kPlotTop + kPlotHeight + 5), "\" stroke=\"#e4e4e4\"/>\n");
    absl::StrAppend(&svg, "<text class=\"tick\" x=\"", x, "\" y=\"",
                    Px(kPlotTop + kPlotHeight + 18), "\">", TickLabel(v, ax, !tokens),
                    "</text>\n");
  }
  absl::StrAppend(&svg, "</g>\n");
  absl::StrAppend(&svg, "<g class=\"y-axis\" font-size=\"11\" text-anchor=\"end\">\n");
  for (int i = 0; i <= ay.num_steps; ++i) {
    const double v = ay.lo + i * ay.step;
    const std::string y = Px(py(v));
    absl::StrAppend(&svg, "<line x1=\"", Px(kPlotLeft - 5), "\" y1=\"", y, "\" x2=\"",
                    Px(kPlotLeft + kPlotWidth), "\" y2=\"", y, "\" stroke=\"#e4e4e4\"/>\n");
    absl::StrAppend(&svg, "<text class=\"tick\" x=\"", Px(kPlotLeft - 8), "\" y=\"",
                    Px(py(v) + 4), "\">", TickLabel(v, ay, false), "</text>\n");
  }
  absl::StrAppend(&svg, "</g>\n");

  if (target > 0) {
    const std::string y = Px(py(target));
    absl::StrAppend(&svg, "<line class=\"target\" x1=\"", Px(kPlotLeft), "\" y1=\"", y,
                    "\" x2=\"", Px(kPlotLeft + kPlotWidth), "\" y2=\"", y,
                    "\" stroke=\"#333333\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n");
    // Curves fall from the upper left, so the left end of the line is clear.
    absl::StrAppend(&svg, "<text class=\"target-label\" x=\"", Px(kPlotLeft + 6), "\" y=\"",
                    Px(py(target) - 5), "\" font-size=\"11\">",
                    absl::StrFormat("target %.4f", target), "</text>\n");
  }

  if (clipped) {
    absl::StrAppend(&svg, "<defs><clipPath id=\"plot\"><rect x=\"", Px(kPlotLeft),
                    "\" y=\"", Px(kPlotTop), "\" width=\"", Px(kPlotWidth), "\" height=\"",
                    Px(kPlotHeight), "\"/></clipPath></defs>\n<g class=\"curves\" "
                    "clip-path=\"url(#plot)\">\n");
  }
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    const std::string name = Xml(s.name);
    std::string d;
    for (size_t i = 0; i < s.points.size(); ++i) {
      absl::StrAppend(&d, i == 0 ? "M" : " L", Px(px(s.points[i].x)), " ", Px(py(s.points[i].y)));
    }
    absl::StrAppend(&svg, "<path class=\"variant\" data-variant=\"", name, "\" d=\"", d,
                    "\" fill=\"none\" stroke=\"", Color(s.color),
                    "\" stroke-width=\"2\" stroke-linejoin=\"round\" stroke-linecap=\"round\"",
                    DashAttribute(s.color), "/>\n");
    if (s.points.size() == 1) {
      absl::StrAppend(&svg, "<circle class=\"point\" data-variant=\"", name, "\" cx=\"",
                      Px(px(s.points[0].x)), "\" cy=\"", Px(py(s.points[0].y)),
                      "\" r=\"3.5\" fill=\"", Color(s.color), "\"/>\n");
    }
  }
  if (clipped) absl::StrAppend(&svg, "</g>\n");
  for (const Crossing& c : crossings) {
    if (c.low < c.high) AppendInterval(c, px(c.low), px(c.high), py(target), tokens, &svg);
  }
  for (const Crossing& c : crossings) {
    const std::string name = Xml(c.series->name);
    absl::StrAppend(&svg, "<circle class=\"crossing\" data-variant=\"", name, "\" cx=\"",
                    Px(px(c.x)), "\" cy=\"", Px(py(target)),
                    "\" r=\"5\" fill=\"#ffffff\" stroke=\"", Color(c.series->color),
                    "\" stroke-width=\"2.5\"><title>", name, " reached the target at ",
                    tokens ? absl::StrCat(Si(c.x), " tokens") : Dollars(c.x),
                    "</title></circle>\n");
  }
}

}  // namespace

std::string RenderExperimentSvg(const Experiment& experiment,
                                const std::vector<VariantCurve>& curves,
                                const ReportOptions& options) {
  std::vector<Series> series = CollectSeries(experiment, curves);
  const bool quantized = ByQuantized(experiment);
  const char* loss_name = quantized ? "quantized validation loss" : "validation loss";
  const XAxis x_axis = PlaceSeries(options, quantized, &series);
  const bool tokens = x_axis == XAxis::kTokens;
  const bool any_points = std::any_of(series.begin(), series.end(),
                                      [](const Series& s) { return !s.points.empty(); });

  const double target = Plottable(experiment.target_val_loss()) && experiment.target_val_loss() > 0
                            ? experiment.target_val_loss()
                            : 0;
  std::vector<Crossing> crossings;
  if (target > 0) {
    for (const Series& s : series) {
      if (s.status == nullptr || !s.status->reached_target()) continue;
      const double x = ToTarget(*s.status, x_axis);
      if (!Plottable(x)) continue;
      Crossing c{&s, x};
      // With replicates: the mean's interval, on an axis the summary has.
      for (const auto& summary : experiment.summaries()) {
        if (summary.name() != s.name || summary.replicates() < 2) continue;
        const bool recipe = x_axis == XAxis::kRecipeDollars;
        const double lo = recipe ? summary.recipe_cost_ci90_low_usd()
                          : tokens ? summary.tokens_ci90_low() : 0;
        const double hi = recipe ? summary.recipe_cost_ci90_high_usd()
                          : tokens ? summary.tokens_ci90_high() : 0;
        if (Plottable(lo) && Plottable(hi) && lo < hi) {
          c.low = lo;
          c.high = hi;
        }
      }
      crossings.push_back(c);
    }
  }

  const int height =
      std::max(kMinHeight,
               static_cast<int>(kPlotTop + kLegendRow * static_cast<double>(series.size()) + 24));
  std::string svg;
  absl::StrAppend(&svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  absl::StrAppendFormat(&svg,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
                        "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
                        "font-size=\"12\" fill=\"#222222\">\n",
                        kWidth, height, kWidth, height);
  const std::string title = Title(experiment);
  absl::StrAppend(&svg, "<title>", title, ": ", loss_name, " against ",
                  tokens ? "tokens" : "dollars", "</title>\n");
  absl::StrAppendFormat(&svg, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", kWidth,
                        height);
  absl::StrAppend(&svg, "<text class=\"title\" x=\"", Px(kPlotLeft),
                  "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">", title, "</text>\n");
  std::vector<std::string> facts;
  if (const std::string state = StateWord(experiment); !state.empty()) facts.push_back(state);
  facts.push_back(target > 0 ? absl::StrFormat("target %s %.4f",
                                               quantized ? "quantized_val_loss" : "val loss",
                                               target)
                             : "no target yet");
  if (Plottable(experiment.cost_usd()) && experiment.cost_usd() > 0) {
    facts.push_back(absl::StrCat(Dollars(experiment.cost_usd()), " spent"));
  }
  absl::StrAppend(&svg, "<text class=\"subtitle\" x=\"", Px(kPlotLeft),
                  "\" y=\"48\" fill=\"#555555\">", absl::StrJoin(facts, " \u00B7 "), "</text>\n");
  absl::StrAppend(&svg, "<rect class=\"frame\" x=\"", Px(kPlotLeft), "\" y=\"", Px(kPlotTop),
                  "\" width=\"", Px(kPlotWidth), "\" height=\"", Px(kPlotHeight),
                  "\" fill=\"none\" stroke=\"#888888\"/>\n");

  if (!any_points) {
    absl::StrAppend(&svg, "<text class=\"empty\" x=\"", Px(kPlotLeft + kPlotWidth / 2), "\" y=\"",
                    Px(kPlotTop + kPlotHeight / 2),
                    "\" text-anchor=\"middle\" font-size=\"14\" fill=\"#666666\">no evaluations "
                    "yet</text>\n");
  } else {
    AppendPlot(series, crossings, target, x_axis, options.zoom, &svg);
  }

  absl::StrAppend(
      &svg, "<text class=\"axis-label\" x=\"", Px(kPlotLeft + kPlotWidth / 2), "\" y=\"",
      Px(kPlotTop + kPlotHeight + 40), "\" text-anchor=\"middle\">",
      x_axis == XAxis::kTokens ? "tokens trained (no evaluation has a dollar cost)"
      : x_axis == XAxis::kRecipeDollars
          ? "recipe dollars (steps x each variant's median step time x its price)"
          : options.billed ? "dollars billed (USD)"
                           : "dollars billed (USD; a variant has no step times for recipe "
                             "dollars)",
      "</text>\n");
  const double y_mid = kPlotTop + kPlotHeight / 2;
  absl::StrAppend(&svg, "<text class=\"axis-label\" x=\"24\" y=\"", Px(y_mid),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 24 ", Px(y_mid),
                  ")\">", loss_name, "</text>\n");

  AppendLegend(series, target, x_axis, &svg);
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace tally::cli
