"""The experiment report's tables and DataFrames, from messages as tallyd
sends them (no tallyd needed)."""

import unittest

from tally import ExperimentReport
from tally._report import SUMMARY_COLUMNS, run_name
from tally.v1 import experiments_pb2


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


if __name__ == "__main__":
    unittest.main()
