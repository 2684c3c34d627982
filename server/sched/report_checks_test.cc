#include "server/sched/report_checks.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sched/scheduler_test_util.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::string name;
  std::function<void(tally::v1::WorkerMessage&)> edit;
  std::string refused;  // the field named; empty: accepted
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A progress report a real worker sends for TinySpec with an MoE of 4.
tally::v1::WorkerMessage Progress() {
  tally::v1::WorkerMessage m;
  tally::v1::Progress& p = *m.mutable_progress();
  p.set_job("jobs/1");
  p.set_attempt(1);
  p.set_step(10);
  p.set_tokens(10 * 64);
  p.set_train_loss(3.2);
  p.set_lr(3e-4);
  p.set_grad_norm(1.1);
  p.set_step_seconds(0.2);
  p.set_useful_tokens_per_second(3000);
  p.set_padding_fraction(0.01);
  p.set_mfu(0.3);
  auto* l = p.add_moe();
  l->set_layer(1);
  for (int e = 0; e < 4; ++e) l->add_tokens_per_expert(16);
  l->set_max_over_mean_load(1.0);
  l->set_router_entropy(1.3);
  return m;
}

tally::v1::JobSpec MoeSpec() {
  tally::v1::JobSpec s = TinySpec();
  s.mutable_model()->set_num_layers(2);
  s.mutable_model()->mutable_moe()->set_num_experts(4);
  s.mutable_training()->set_global_batch_tokens(64);
  return s;
}

class ReportChecksTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReportChecksTest, ChecksTheReport) {
  tally::v1::WorkerMessage m = Progress();
  GetParam().edit(m);
  absl::Status s = CheckReportFigures(m);
  if (s.ok()) s = CheckReportAgainstSpec(MoeSpec(), m);
  if (GetParam().refused.empty()) {
    EXPECT_TRUE(s.ok()) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(GetParam().refused));
  }
}

tally::v1::Progress& P(tally::v1::WorkerMessage& m) { return *m.mutable_progress(); }

INSTANTIATE_TEST_SUITE_P(
    Table, ReportChecksTest,
    ::testing::Values(
        Case{"a_real_report", [](auto&) {}, ""},
        Case{"diverging_losses_pass", [](auto& m) {
               P(m).set_train_loss(kNaN);
               P(m).set_grad_norm(kInf);
             }, ""},
        Case{"negative_loss", [](auto& m) { P(m).set_train_loss(-1e308); },
             "progress.train_loss"},
        Case{"minus_infinity_loss", [](auto& m) { P(m).set_train_loss(-kInf); },
             "progress.train_loss"},
        Case{"nan_lr", [](auto& m) { P(m).set_lr(kNaN); }, "progress.lr"},
        Case{"negative_step_time", [](auto& m) { P(m).set_step_seconds(-1); },
             "progress.step_seconds"},
        Case{"infinite_rate", [](auto& m) { P(m).set_useful_tokens_per_second(kInf); },
             "progress.useful_tokens_per_second"},
        Case{"padding_over_one", [](auto& m) { P(m).set_padding_fraction(1.5); },
             "progress.padding_fraction"},
        Case{"nan_mfu", [](auto& m) { P(m).set_mfu(kNaN); }, "progress.mfu"},
        Case{"tokens_no_batch_reaches",
             [](auto& m) { P(m).set_tokens(std::numeric_limits<int64_t>::max()); },
             "progress.tokens"},
        Case{"padding_tokens_no_batch_reaches",
             [](auto& m) { P(m).set_padding_tokens(int64_t{1} << 50); },
             "progress.padding_tokens"},
        Case{"moe_layer_past_the_model", [](auto& m) { P(m).mutable_moe(0)->set_layer(2); },
             "progress.moe.layer"},
        Case{"negative_moe_layer", [](auto& m) { P(m).mutable_moe(0)->set_layer(-1); },
             "progress.moe.layer"},
        Case{"more_experts_than_the_model",
             [](auto& m) { P(m).mutable_moe(0)->add_tokens_per_expert(1); },
             "progress.moe.tokens_per_expert"},
        Case{"dropped_fraction_over_one",
             [](auto& m) { P(m).mutable_moe(0)->set_dropped_fraction(2); },
             "progress.moe.dropped_fraction"},
        Case{"nan_entropy", [](auto& m) { P(m).mutable_moe(0)->set_router_entropy(kNaN); },
             "progress.moe.router_entropy"},
        Case{"negative_amax", [](auto& m) { (*P(m).mutable_fp8_amax())["ffn.input"] = -1; },
             "progress.fp8_amax"},
        Case{"negative_underflows", [](auto& m) { P(m).set_fp8_underflows(-1); },
             "progress.fp8_underflows"},
        Case{"a_negative_eval_loss", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(-1e308);
             }, "eval.val_loss"},
        Case{"a_negative_document_weighted_loss", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(2);
               m.mutable_eval()->set_doc_val_loss(-0.5);
             }, "eval.doc_val_loss"},
        Case{"a_negative_document_count", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(2);
               m.mutable_eval()->set_docs(-3);
             }, "eval.docs"},
        Case{"a_loss_no_model_reaches", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(1e-300);
             }, "eval.val_loss: must be at least 1e-06"},
        Case{"a_zero_eval_loss", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
             }, "eval.val_loss"},
        Case{"a_document_weighted_loss_no_model_reaches", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(2);
               m.mutable_eval()->set_doc_val_loss(1e-9);
             }, "eval.doc_val_loss"},
        Case{"a_diverged_eval_passes", [](auto& m) {
               m.mutable_eval()->set_job("jobs/1");
               m.mutable_eval()->set_step(10);
               m.mutable_eval()->set_val_loss(kNaN);
             }, ""},
        Case{"an_eval_past_max_steps", [](auto& m) {
               m.mutable_eval()->set_step(1001);
               m.mutable_eval()->set_val_loss(2);
             }, "eval.step"},
        Case{"a_checkpoint_with_a_malformed_sha", [](auto& m) {
               m.mutable_checkpoint()->set_path("/c/job-1/step-10");
               m.mutable_checkpoint()->set_sha256("not-a-sha");
             }, "checkpoint.sha256"},
        Case{"a_checkpoint_with_a_sha", [](auto& m) {
               m.mutable_checkpoint()->set_step(10);
               m.mutable_checkpoint()->set_path("/c/job-1/step-10");
               m.mutable_checkpoint()->set_sha256(std::string(64, 'a'));
             }, ""}),
    [](const auto& info) { return info.param.name; });

// A calibration job of two specs, and its worker's successful exit.
tally::v1::JobSpec CalibrationSpec() {
  tally::v1::JobSpec s = TinySpec();
  s.mutable_training()->set_max_steps(36);
  auto* cal = s.mutable_calibration();
  cal->set_rounds(3);
  cal->set_steps(5);
  for (const char* name : {"naive", "packed"}) {
    auto* v = cal->add_variants();
    v->set_name(name);
    *v->mutable_spec() = TinySpec();
  }
  return s;
}

tally::v1::WorkerMessage CalibrationExit() {
  tally::v1::WorkerMessage m;
  auto* x = m.mutable_exit();
  x->set_job("jobs/1");
  x->set_attempt(1);
  x->set_step(36);
  x->set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
  for (const char* name : {"naive", "packed"}) {
    auto* t = x->add_calibration();
    t->set_name(name);
    t->set_median_seconds(0.2);
    t->set_p10_seconds(0.18);
    t->set_p90_seconds(0.25);
    t->set_samples(15);
  }
  return m;
}

struct ExitCase {
  std::string name;
  std::function<void(tally::v1::WorkerMessage&, tally::v1::JobSpec&)> edit;
  std::string refused;
};
void PrintTo(const ExitCase& c, std::ostream* os) { *os << c.name; }

class CalibrationExitTest : public ::testing::TestWithParam<ExitCase> {};

TEST_P(CalibrationExitTest, ChecksTheTimes) {
  tally::v1::WorkerMessage m = CalibrationExit();
  tally::v1::JobSpec spec = CalibrationSpec();
  GetParam().edit(m, spec);
  absl::Status s = CheckReportFigures(m);
  if (s.ok()) s = CheckReportAgainstSpec(spec, m);
  if (GetParam().refused.empty()) {
    EXPECT_TRUE(s.ok()) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(GetParam().refused));
  }
}

tally::v1::CalibratedStepTime& T(tally::v1::WorkerMessage& m, int i) {
  return *m.mutable_exit()->mutable_calibration(i);
}

INSTANTIATE_TEST_SUITE_P(
    Table, CalibrationExitTest,
    ::testing::Values(
        ExitCase{"a_real_exit", [](auto&, auto&) {}, ""},
        ExitCase{"on_a_job_that_is_no_calibration",
                 [](auto&, auto& spec) { spec.clear_calibration(); },
                 "exit.calibration: the job is not a timing calibration"},
        ExitCase{"on_a_failed_exit",
                 [](auto& m, auto&) {
                   m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
                 },
                 "only a SUCCEEDED exit"},
        ExitCase{"one_time_missing",
                 [](auto& m, auto&) { m.mutable_exit()->mutable_calibration()->RemoveLast(); },
                 "one time per spec"},
        ExitCase{"another_name", [](auto& m, auto&) { T(m, 1).set_name("moe"); },
                 "exit.calibration[1].name"},
        ExitCase{"nan_median", [](auto& m, auto&) { T(m, 0).set_median_seconds(kNaN); },
                 "exit.calibration[0].median_seconds"},
        ExitCase{"zero_median", [](auto& m, auto&) { T(m, 0).set_median_seconds(0); },
                 "exit.calibration[0].median_seconds"},
        ExitCase{"longer_than_a_day",
                 [](auto& m, auto&) {
                   T(m, 0).set_median_seconds(1e6);
                   T(m, 0).set_p90_seconds(1e6);
                 },
                 "exit.calibration[0].median_seconds"},
        ExitCase{"percentiles_out_of_order",
                 [](auto& m, auto&) { T(m, 0).set_p10_seconds(0.3); },
                 "p10_seconds <= median_seconds"},
        ExitCase{"more_samples_than_timed",
                 [](auto& m, auto&) { T(m, 0).set_samples(16); },
                 "exit.calibration[0].samples"},
        ExitCase{"no_samples", [](auto& m, auto&) { T(m, 0).set_samples(0); },
                 "exit.calibration[0].samples"}),
    [](const auto& info) { return info.param.name; });

// An evaluation of a job whose spec asks for a quantized evaluation
// (training.eval_quantized, as ApplySpecDefaults sets it from training.qat).
tally::v1::WorkerMessage QuantizedEval() {
  tally::v1::WorkerMessage m;
  auto* e = m.mutable_eval();
  e->set_job("jobs/1");
  e->set_attempt(1);
  e->set_step(10);
  e->set_tokens(640);
  e->set_val_loss(2.31);
  e->set_quantized_val_loss(2.38);
  return m;
}

tally::v1::JobSpec QuantizedSpec() {
  tally::v1::JobSpec s = TinySpec();
  s.mutable_training()->set_eval_quantized("q4_0");
  s.mutable_training()->set_eval_quantized_layers("ffn");
  return s;
}

class QuantizedEvalTest : public ::testing::TestWithParam<ExitCase> {};

TEST_P(QuantizedEvalTest, ChecksTheQuantizedLoss) {
  tally::v1::WorkerMessage m = QuantizedEval();
  tally::v1::JobSpec spec = QuantizedSpec();
  GetParam().edit(m, spec);
  absl::Status s = CheckReportFigures(m);
  if (s.ok()) s = CheckReportAgainstSpec(spec, m);
  if (GetParam().refused.empty()) {
    EXPECT_TRUE(s.ok()) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(GetParam().refused));
  }
}

tally::v1::EvalResult& E(tally::v1::WorkerMessage& m) { return *m.mutable_eval(); }

INSTANTIATE_TEST_SUITE_P(
    Table, QuantizedEvalTest,
    ::testing::Values(
        ExitCase{"a_real_eval", [](auto&, auto&) {}, ""},
        ExitCase{"diverged_passes", [](auto& m, auto&) { E(m).set_quantized_val_loss(kNaN); },
                 ""},
        ExitCase{"plus_infinity_passes",
                 [](auto& m, auto&) { E(m).set_quantized_val_loss(kInf); }, ""},
        ExitCase{"negative", [](auto& m, auto&) { E(m).set_quantized_val_loss(-0.5); },
                 "eval.quantized_val_loss: must be >= 0"},
        ExitCase{"minus_infinity", [](auto& m, auto&) { E(m).set_quantized_val_loss(-kInf); },
                 "eval.quantized_val_loss"},
        ExitCase{"zero", [](auto& m, auto&) { E(m).set_quantized_val_loss(0); },
                 "eval.quantized_val_loss: must be at least 1e-06"},
        ExitCase{"below_any_model", [](auto& m, auto&) { E(m).set_quantized_val_loss(1e-9); },
                 "eval.quantized_val_loss: must be at least 1e-06"},
        ExitCase{"for_a_job_evaluated_unquantized",
                 [](auto&, auto& spec) {
                   spec.mutable_training()->clear_eval_quantized();
                   spec.mutable_training()->clear_eval_quantized_layers();
                 },
                 "eval.quantized_val_loss: the job evaluates no quantized model"},
        ExitCase{"missing_for_a_job_evaluated_quantized",
                 [](auto& m, auto&) { E(m).clear_quantized_val_loss(); },
                 "eval.quantized_val_loss: missing; the job's spec asks for a quantized "
                 "evaluation (training.eval_quantized q4_0, layers ffn)"},
        ExitCase{"absent_for_a_job_evaluated_unquantized",
                 [](auto& m, auto& spec) {
                   E(m).clear_quantized_val_loss();
                   spec.mutable_training()->clear_eval_quantized();
                 },
                 ""}),
    [](const auto& info) { return info.param.name; });

TEST(CheckLabelValueTest, BoundsAGpuType) {
  EXPECT_TRUE(CheckLabelValue("hello.gpu_type", "h200").ok());
  EXPECT_TRUE(CheckLabelValue("hello.gpu_type", "nvidia-h200_sxm:141g").ok());
  const absl::Status long_one = CheckLabelValue("hello.gpu_type", std::string(32 * 1024, 'x'));
  EXPECT_THAT(long_one.message(), HasSubstr("hello.gpu_type"));
  EXPECT_THAT(long_one.message(), HasSubstr("32768 bytes"));
  EXPECT_LT(long_one.message().size(), 300u) << "the refusal echoes the whole value";
  EXPECT_FALSE(CheckLabelValue("hello.gpu_type", "a b").ok());
  EXPECT_FALSE(CheckLabelValue("hello.gpu_type", "a\"}").ok());
  EXPECT_FALSE(CheckLabelValue("hello.gpu_type", "").ok());
}

}  // namespace
}  // namespace tally::sched
