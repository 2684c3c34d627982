// experiment_report_sample DIR: writes the experiment report for a few fixed
// experiments (typical, without prices, without a target, many variants,
// nothing evaluated, hostile strings and values) to DIR/NAME.svg, for
// looking at and for checking with a real SVG renderer
// (experiment_report_render_test.sh).
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/tallyctl/experiment_report.h"

namespace {

using ::tally::cli::VariantCurve;
using ::tally::v1::EvalPoint;
using ::tally::v1::Experiment;

constexpr double kTarget = 3.2;
constexpr int64_t kTokensPerEval = 131072;

struct Recipe {
  std::string name;
  double rate;          // how fast the loss falls per evaluation
  double floor;         // the loss it levels off at
  double usd_per_eval;  // 0: no prices
  int num_evals;
};

// An exponential-decay curve per recipe, with the crossing of kTarget
// interpolated between the two evaluations that straddle it, as tallyd does.
void Add(const Recipe& r, Experiment* e, std::vector<VariantCurve>* curves) {
  tally::v1::VariantStatus* s = e->add_variants();
  s->set_name(r.name);
  VariantCurve c{r.name, {}};
  for (int i = 0; i < r.num_evals; ++i) {
    EvalPoint p;
    p.set_step(100 * (i + 1));
    p.set_tokens(kTokensPerEval * (i + 1));
    p.set_cost_usd(r.usd_per_eval * (i + 1));
    p.set_val_loss(r.floor + 8.0 * std::exp(-0.35 * r.rate * (i + 1)));
    if (!s->reached_target() && !c.curve.empty() && p.val_loss() <= kTarget) {
      const EvalPoint& prev = c.curve.back();
      const double f = (prev.val_loss() - kTarget) / (prev.val_loss() - p.val_loss());
      s->set_reached_target(true);
      s->set_cost_to_target_usd(prev.cost_usd() + f * (p.cost_usd() - prev.cost_usd()));
      s->set_tokens_to_target(prev.tokens() + f * kTokensPerEval);
    }
    c.curve.push_back(p);
  }
  if (!c.curve.empty()) {
    s->set_val_loss(c.curve.back().val_loss());
    s->set_cost_usd(c.curve.back().cost_usd());
    if (!s->reached_target()) s->set_note("never reached the target");
  }
  e->set_cost_usd(e->cost_usd() + s->cost_usd());
  curves->push_back(std::move(c));
}

Experiment Base(const std::string& display_name, double target) {
  Experiment e;
  e.set_name("experiments/12");
  e.mutable_spec()->set_display_name(display_name);
  e.set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  e.set_target_val_loss(target);
  return e;
}

bool Write(const std::string& path, const Experiment& e, const std::vector<VariantCurve>& c) {
  std::ofstream out(path);
  out << tally::cli::RenderExperimentSvg(e, c);
  out.close();
  if (!out) std::cerr << "experiment_report_sample: cannot write " << path << "\n";
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: experiment_report_sample DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;
  for (const bool priced : {true, false}) {
    Experiment e = Base("warmup & lr <sweep>", kTarget);
    std::vector<VariantCurve> curves;
    const double usd = priced ? 0.12 : 0;
    Add({"baseline", 0.9, 2.9, usd, 14}, &e, &curves);
    Add({"lr-3e-4", 1.4, 2.8, usd * 0.9, 12}, &e, &curves);
    Add({"warmup-long", 0.6, 3.0, usd * 1.1, 16}, &e, &curves);
    Add({"queued", 0, 0, 0, 0}, &e, &curves);
    ok &= Write(absl::StrCat(dir, priced ? "/typical.svg" : "/no_prices.svg"), e, curves);
  }
  {
    Experiment e = Base("no target yet", 0);
    std::vector<VariantCurve> curves;
    Add({"a", 0.9, 2.9, 0.1, 10}, &e, &curves);
    Add({"b", 1.2, 2.7, 0.1, 1}, &e, &curves);
    ok &= Write(dir + "/no_target.svg", e, curves);
  }
  {
    Experiment e = Base("thirty-two variants", kTarget);
    std::vector<VariantCurve> curves;
    for (int i = 0; i < 32; ++i) {
      Add({absl::StrCat("variant-", i, "-with-a-rather-long-name-for-the-legend"), 0.5 + 0.05 * i,
           2.7 + 0.015 * i, 0.1, 10},
          &e, &curves);
    }
    ok &= Write(dir + "/many.svg", e, curves);
  }
  ok &= Write(dir + "/empty.svg", Experiment(), {});
  {
    const std::string hostile =
        std::string("<b>&amp;\"'\x01\x1b[31m\xff\xc0\xe2\x80\xae") + std::string(1, '\0') + "]]>";
    Experiment e = Base(hostile, kTarget);
    std::vector<VariantCurve> curves;
    Add({hostile, 0.9, 2.9, 0.1, 10}, &e, &curves);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    for (const double v : {nan, inf, -inf, 1e300}) {
      EvalPoint p;
      p.set_cost_usd(v);
      p.set_val_loss(v);
      curves[0].curve.push_back(p);
    }
    e.mutable_variants(0)->set_note(hostile);
    ok &= Write(dir + "/hostile.svg", e, curves);
  }
  return ok ? 0 : 1;
}
