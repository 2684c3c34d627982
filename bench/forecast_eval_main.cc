// forecast_eval: runs ForecastFinalLoss on a curve read from stdin, for
// bench/forecast_accuracy.py and for looking at a run by hand.
//
// Input: one evaluation per line, "STEP TOKENS VAL_LOSS" (whitespace
// separated; "nan" and "inf" are read as such; blank lines and lines
// starting with '#' are skipped).
// Output: one JSON object on stdout with the forecast and, when --target or
// --best is given, the decision. Exit 0 with a forecast of any status; 2 on
// a usage error or an unreadable line (named by its number).
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/policy/forecast.h"

ABSL_FLAG(int64_t, max_steps, 0, "the run's max_steps");
ABSL_FLAG(double, tokens_per_step, 0, "tokens per step, counted like the TOKENS column");
ABSL_FLAG(int64_t, warmup_steps, 0, "warm-up steps of the learning-rate schedule");
ABSL_FLAG(double, min_lr_ratio, 0, "min_lr / lr of the cosine schedule");
ABSL_FLAG(int, min_evals, 4, "fitted evaluations needed");
ABSL_FLAG(double, settle_warmups, 2.0, "fit evaluations after this many warm-ups");
ABSL_FLAG(double, band_k, 2.0, "band half-width in residual standard deviations");
ABSL_FLAG(double, min_rel_std, 0.002, "floor of the residual std, relative to the last loss");
ABSL_FLAG(double, lr_decay_allowance, 0.10, "relative drop the remaining cosine decay may bring");
ABSL_FLAG(std::string, target, "", "a target val_loss: also decide CannotReach");
ABSL_FLAG(std::string, best, "", "the best val_loss so far: also decide CannotImproveBy");
ABSL_FLAG(double, min_rel_delta, 0.03, "with --best: the relative improvement needed");

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      out += absl::StrFormat("\\u%04x", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) { return std::isfinite(v) ? absl::StrFormat("%.17g", v) : "null"; }

bool ParseDouble(absl::string_view s, double* out) {
  const std::string lower = absl::AsciiStrToLower(std::string(s));
  if (lower == "nan" || lower == "-nan") {
    *out = std::nan("");
    return true;
  }
  return absl::SimpleAtod(s, out);  // also takes inf
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "forecast_eval: forecast the final validation loss of a curve on stdin.\n\n"
      "Usage: forecast_eval --max_steps=N --tokens_per_step=T [--warmup_steps=W] "
      "[--min_lr_ratio=M] [--target=L | --best=L] < curve.txt\n"
      "curve.txt: one 'STEP TOKENS VAL_LOSS' line per evaluation");
  absl::ParseCommandLine(argc, argv);

  std::vector<tally::policy::ForecastPoint> curve;
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(trimmed, absl::ByAnyChar(" \t,"), absl::SkipEmpty());
    tally::policy::ForecastPoint p;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &p.step) || !absl::SimpleAtoi(f[1], &p.tokens) ||
        !ParseDouble(f[2], &p.val_loss)) {
      std::cerr << "forecast_eval: stdin line " << line_no
                << ": want 'STEP TOKENS VAL_LOSS' (integers, integer, number), got '" << trimmed
                << "'\n";
      return 2;
    }
    curve.push_back(p);
  }

  tally::policy::ForecastRun run;
  run.max_steps = absl::GetFlag(FLAGS_max_steps);
  run.tokens_per_step = absl::GetFlag(FLAGS_tokens_per_step);
  run.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  run.min_lr_ratio = absl::GetFlag(FLAGS_min_lr_ratio);
  tally::policy::ForecastOptions options;
  options.min_evals = absl::GetFlag(FLAGS_min_evals);
  options.settle_warmups = absl::GetFlag(FLAGS_settle_warmups);
  options.band_k = absl::GetFlag(FLAGS_band_k);
  options.min_rel_std = absl::GetFlag(FLAGS_min_rel_std);
  options.lr_decay_allowance = absl::GetFlag(FLAGS_lr_decay_allowance);
  const tally::policy::LossForecast fc = tally::policy::ForecastFinalLoss(curve, run, options);

  std::string decision;
  auto add_decision = [&](const char* name, const tally::policy::ForecastDecision& d) {
    decision += absl::StrFormat(", \"%s\": {\"stop\": %s, \"reason\": %s}", name,
                                d.stop ? "true" : "false", JsonString(d.reason));
  };
  if (!absl::GetFlag(FLAGS_target).empty()) {
    double target = 0;
    if (!absl::SimpleAtod(absl::GetFlag(FLAGS_target), &target)) {
      std::cerr << "forecast_eval: --target: not a number\n";
      return 2;
    }
    add_decision("cannot_reach", tally::policy::CannotReach(fc, target));
  }
  if (!absl::GetFlag(FLAGS_best).empty()) {
    double best = 0;
    if (!absl::SimpleAtod(absl::GetFlag(FLAGS_best), &best)) {
      std::cerr << "forecast_eval: --best: not a number\n";
      return 2;
    }
    add_decision("cannot_improve",
                 tally::policy::CannotImproveBy(fc, best, absl::GetFlag(FLAGS_min_rel_delta)));
  }
  std::cout << absl::StrFormat(
                   "{\"status\": \"%s\", \"reason\": %s, \"at_step\": %d, \"at_tokens\": %s, "
                   "\"predicted\": %s, \"low\": %s, \"high\": %s, \"a\": %s, \"b\": %s, "
                   "\"c\": %s, \"residual_std\": %s, \"decay_allowance\": %s, "
                   "\"evals_used\": %d, \"evals_before_fit\": %d, \"evals_non_finite\": %d, "
                   "\"evals_outliers\": %d%s}",
                   tally::policy::ForecastStatusName(fc.status), JsonString(fc.reason), fc.at_step,
                   JsonNumber(fc.at_tokens), JsonNumber(fc.predicted), JsonNumber(fc.low),
                   JsonNumber(fc.high), JsonNumber(fc.a), JsonNumber(fc.b), JsonNumber(fc.c),
                   JsonNumber(fc.residual_std), JsonNumber(fc.decay_allowance), fc.evals_used,
                   fc.evals_before_fit, fc.evals_non_finite, fc.evals_outliers, decision)
            << std::endl;
  return 0;
}
