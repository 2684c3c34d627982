"""The experiment report's tables and DataFrames, from messages as tallyd
sends them (no tallyd needed)."""

import math
import unittest

from tally import EvalHistory, ExperimentReport, TrainHistory
from tally._report import EVAL_COLUMNS, SUMMARY_COLUMNS, loss_of, run_name
from tally.v1 import experiments_pb2, jobs_pb2


def replicated() -> experiments_pb2.Experiment:
    e = experiments_pb2.Experiment(name="experiments/3", reference_variant="naive",
                                   target_val_loss=2.5)
    e.spec.replicates = 2
    for name in ("naive", "packed"):
        e.spec.variants.add(name=name)
        for r in (1, 2):
            e.variants.add(name=name, replicate=r, seed=r - 1, reached_target=True,
                           recipe_cost_to_target_usd=0.01 * r)
    e.summaries.add(name="naive", replicates=2, reached_target=2, verdict="reference",
                    recipe_cost_to_target_usd=0.015, recipe_cost_ci90_low_usd=0.01,
                    recipe_cost_ci90_high_usd=0.02)
    e.summaries.add(name="packed", replicates=2, reached_target=2, ratio_pairs=2,
                    recipe_cost_to_target_usd=0.009, recipe_cost_ci90_low_usd=0.008,
                    recipe_cost_ci90_high_usd=0.010, recipe_ratio_to_reference=0.6,
                    recipe_ratio_ci90_low=0.55, recipe_ratio_ci90_high=0.66,
                    verdict="cheaper")
    return e


class ReportTest(unittest.TestCase):
    def test_runs_are_named_by_replicate(self) -> None:
        e = replicated()
        self.assertEqual([run_name(v) for v in e.variants],
                         ["naive", "naive#2", "packed", "packed#2"])

    def test_summary_rows_and_table_show_the_interval_and_verdict(self) -> None:
        report = ExperimentReport(experiment=replicated())
        rows = report.summary_rows()
        self.assertEqual([r["name"] for r in rows], ["naive", "packed"])
        self.assertEqual(set(rows[1]), set(SUMMARY_COLUMNS))
        self.assertEqual(rows[1]["verdict"], "cheaper")
        self.assertEqual(rows[1]["recipe_ratio_ci90_high"], 0.66)
        text = report.table()
        self.assertIn("packed#2", text)
        self.assertIn("over 2 replicates", text)
        self.assertIn("0.60x (0.55x-0.66x)", text)
        self.assertIn("$0.0090 ($0.0080-$0.0100)", text)

    def test_dataframes_index_runs_and_variants(self) -> None:
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed")
        report = ExperimentReport(experiment=replicated())
        runs = report.to_dataframe()
        self.assertEqual(list(runs.index.names), ["name", "replicate"])
        self.assertEqual(runs.loc[("packed", 2), "recipe_cost_to_target_usd"], 0.02)
        summary = report.summary_dataframe()
        self.assertEqual(summary.loc["packed", "verdict"], "cheaper")
        self.assertEqual(summary.loc["naive", "recipe_cost_ci90_low_usd"], 0.01)


def quantized_curve() -> list[jobs_pb2.EvalPoint]:
    """A job evaluated quantized from step 10 on (step 0 without it)."""
    return [jobs_pb2.EvalPoint(step=0, val_loss=5.0),
            jobs_pb2.EvalPoint(step=10, val_loss=3.1, quantized_val_loss=3.3),
            jobs_pb2.EvalPoint(step=20, val_loss=2.9, quantized_val_loss=0.0)]


class QuantizedLossTest(unittest.TestCase):
    def test_eval_rows_have_the_quantized_loss_nan_when_absent(self) -> None:
        rows = EvalHistory(job="jobs/1", points=quantized_curve()).rows()
        self.assertEqual(set(rows[0]), set(EVAL_COLUMNS))
        self.assertTrue(math.isnan(rows[0]["quantized_val_loss"]), "absent is not 0")
        self.assertEqual(rows[1]["quantized_val_loss"], 3.3)
        self.assertEqual(rows[2]["quantized_val_loss"], 0.0, "present 0 stays 0")
        self.assertTrue(math.isnan(loss_of(quantized_curve()[0], "quantized_val_loss")))
        self.assertEqual(loss_of(quantized_curve()[1], "quantized_val_loss"), 3.3)
        self.assertEqual(loss_of(quantized_curve()[1], ""), 3.1)

    def test_eval_dataframe_has_a_quantized_column(self) -> None:
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed")
        df = EvalHistory(job="jobs/1", points=quantized_curve()).to_dataframe()
        self.assertIn("quantized_val_loss", df.columns)
        self.assertTrue(math.isnan(df["quantized_val_loss"][0]))
        self.assertEqual(df["quantized_val_loss"][1], 3.3)

    def test_an_experiment_judged_by_the_quantized_loss(self) -> None:
        e = experiments_pb2.Experiment(name="experiments/4", reference_variant="ptq",
                                       target_val_loss=2.6)
        e.spec.target.from_variant = "ptq"
        e.spec.target.metric = "quantized_val_loss"
        e.variants.add(name="ptq", final_val_loss=2.0, final_quantized_val_loss=2.6,
                       best_val_loss=2.0, best_quantized_val_loss=2.6, quantized_val_loss=2.6)
        e.variants.add(name="plain", final_val_loss=2.1, best_val_loss=2.1)
        report = ExperimentReport(experiment=e)
        self.assertEqual(report.metric, "quantized_val_loss")
        rows = report.rows()
        self.assertEqual(rows[0]["final_quantized_val_loss"], 2.6)
        self.assertTrue(math.isnan(rows[1]["quantized_val_loss"]))
        text = report.table()
        self.assertIn("target quantized_val_loss: 2.6000", text)
        self.assertIn("FINAL Q", text)
        ptq = [line for line in text.splitlines() if line.startswith("ptq ")][0]
        self.assertIn("2.6000", ptq)
        self.assertNotIn("2.0000", ptq, "the quantized figures, not val_loss's")
        self.assertEqual(ExperimentReport(experiment=experiments_pb2.Experiment()).metric,
                         "val_loss")

    def test_unknown_figures_are_nan_so_min_and_mean_skip_them(self) -> None:
        e = experiments_pb2.Experiment(name="experiments/5", target_val_loss=2.5)
        e.variants.add(name="done", state=jobs_pb2.JOB_STATE_SUCCEEDED, final_val_loss=2.4,
                       best_val_loss=2.4, reached_target=True, cost_to_target_usd=0.5,
                       tokens_to_target=1000, recipe_cost_to_target_usd=0.4,
                       step_seconds=0.2, recipe_usd_per_step=0.001)
        e.variants.add(name="running", state=jobs_pb2.JOB_STATE_RUNNING, cost_usd=0.1)
        e.variants.add(name="missed", state=jobs_pb2.JOB_STATE_EARLY_STOPPED,
                       final_val_loss=2.7, best_val_loss=2.6)
        report = ExperimentReport(experiment=e)
        rows = {r["name"]: r for r in report.rows()}
        for column in ("final_val_loss", "best_val_loss", "cost_to_target_usd",
                       "tokens_to_target", "recipe_cost_to_target_usd", "step_seconds",
                       "recipe_usd_per_step", "ratio_to_reference", "target_step"):
            self.assertTrue(math.isnan(rows["running"][column]), column)
        for column in ("cost_to_target_usd", "tokens_to_target", "steps_to_target"):
            self.assertTrue(math.isnan(rows["missed"][column]), column)
        self.assertEqual(rows["missed"]["final_val_loss"], 2.7)
        self.assertEqual(rows["running"]["cost_usd"], 0.1)  # a known figure stays
        self.assertEqual(rows["done"]["cost_to_target_usd"], 0.5)
        df = report.to_dataframe()
        self.assertEqual(df.final_val_loss.min(), 2.4)
        self.assertEqual(df.cost_to_target_usd.mean(), 0.5)
        self.assertEqual(report.rows(), report.rows())  # NaN is one object: rows compare equal
        summary = ExperimentReport(experiment=replicated()).summary_rows()
        self.assertTrue(math.isnan(summary[0]["recipe_ratio_ci90_low"]))  # the reference's

    def test_train_history_is_one_row_per_reported_step(self) -> None:
        points = [jobs_pb2.TrainPoint(step=s, tokens=s * 64, train_loss=4.0 - s / 10, attempt=1)
                  for s in (1, 2, 3)]
        df = TrainHistory(job="jobs/1", points=points).to_dataframe()
        self.assertEqual(list(df.columns), ["step", "tokens", "train_loss", "attempt"])
        self.assertEqual(list(df["step"]), [1, 2, 3])
        self.assertAlmostEqual(df["train_loss"].iloc[-1], 3.7)


if __name__ == "__main__":
    unittest.main()
