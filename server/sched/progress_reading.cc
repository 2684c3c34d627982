#include "server/sched/progress_reading.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "server/policy/step_times.h"

namespace tally::sched {
namespace {

// One step time into the job's sample (policy/step_times.h).
void AddStepTime(double seconds, tally::v1::StepTimes* t) {
  policy::StepTimeSample s;
  s.seconds.assign(t->seconds().begin(), t->seconds().end());
  s.stride = t->stride();
  s.reports = t->reports();
  if (!policy::AddStepTime(seconds, &s)) return;
  t->mutable_seconds()->Assign(s.seconds.begin(), s.seconds.end());
  t->set_stride(s.stride);
  t->set_reports(s.reports);
}

std::string CollapseWhere(const metrics::MoeLayerHealth& h) {
  return h.idle_experts > 0
             ? absl::StrFormat("layer %d has %d of %d experts idle (below %.0f%% of their "
                               "fair share %.1f%% of its tokens)",
                               h.layer, h.idle_experts, h.num_experts,
                               100 * metrics::kIdleFractionOfFair, 100 * h.fair_share)
             : absl::StrFormat("layer %d expert %d took %.0f%% of its layer's tokens (fair "
                               "share %.1f%%)",
                               h.layer, h.busiest_expert, 100 * h.busiest_share,
                               100 * h.fair_share);
}

}  // namespace

ProgressReading ReadProgress(const ActiveJob& job, const tally::v1::Progress& p) {
  ProgressReading r;
  r.attempt = p.attempt();
  r.step = p.step();
  r.tokens = p.tokens();
  if (!p.trained()) return r;
  r.train_loss = p.train_loss();
  r.padding_tokens = p.padding_tokens();
  const bool same = job.progress_attempt == p.attempt();
  if (same && job.progress_reports >= policy::kStartupReports && p.step() > job.progress_step) {
    r.step_seconds = p.step_seconds();
  }
  if (p.moe_size() == 0) return r;
  r.moe_reported = true;
  r.moe.reserve(p.moe_size());
  const int top_k = job.rec.job().spec().model().moe().top_k();
  for (const auto& l : p.moe()) {
    r.moe.push_back(metrics::AssessMoeLayer(l, top_k));
    const metrics::MoeLayerHealth& h = r.moe.back();
    if (!h.collapsed || r.routing_collapsed) continue;
    r.routing_collapsed = true;
    r.collapse_where = CollapseWhere(h);
  }
  return r;
}

void ApplyProgressReading(const ProgressReading& r, ActiveJob& job) {
  tally::v1::Job& j = *job.rec.mutable_job();
  j.set_step(r.step);
  j.set_tokens(r.tokens);
  if (r.train_loss) {
    j.set_train_loss(*r.train_loss);
    tally::v1::TrainPoint point;
    point.set_step(r.step);
    point.set_tokens(r.tokens);
    point.set_train_loss(*r.train_loss);
    point.set_attempt(r.attempt);
    AddTrainPoint(point, j);
  }
  if (r.padding_tokens) j.set_padding_tokens(*r.padding_tokens);
  if (r.step_seconds) AddStepTime(*r.step_seconds, j.mutable_step_times());
  if (r.moe_reported) {
    job.routing_collapsed = r.routing_collapsed;
    job.collapse_where = r.collapse_where;
  }
}

void AddTrainPoint(const tally::v1::TrainPoint& point, tally::v1::Job& job, int max_points) {
  auto* curve = job.mutable_train_curve();
  while (!curve->empty() && curve->rbegin()->step() >= point.step()) curve->RemoveLast();
  if (!curve->empty() && job.train_curve_every() > 0 &&
      point.step() - curve->rbegin()->step() < job.train_curve_every()) {
    return;
  }
  *curve->Add() = point;
  if (curve->size() <= max_points) return;
  const int64_t span = curve->rbegin()->step() - curve->begin()->step();
  int kept = 0;
  for (int i = 0; i < curve->size(); i += 2) curve->SwapElements(kept++, i);
  curve->DeleteSubrange(kept, curve->size() - kept);
  const int64_t every = job.train_curve_every() > 0
                            ? 2 * job.train_curve_every()
                            : std::max<int64_t>(2, 2 * span / std::max(1, max_points));
  job.set_train_curve_every(every);
}

}  // namespace tally::sched
