"""Tables over tallyd's figures: an experiment's variant table and a job's
evaluation history, printable and (with the ``pandas`` extra) as
DataFrames."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tally.v1 import experiments_pb2, jobs_pb2

__all__ = ["ExperimentReport", "EvalHistory", "TrainHistory", "TRAIN_COLUMNS", "VARIANT_COLUMNS",
           "SUMMARY_COLUMNS",
           "EVAL_COLUMNS", "OPTIONAL_COLUMNS", "run_name", "loss_of"]

# The variant table's columns: VariantStatus fields, in this order.
VARIANT_COLUMNS = (
    "name", "job", "state", "step", "final_val_loss", "best_val_loss", "cost_usd",
    "reached_target", "cost_to_target_usd", "tokens_to_target", "gpu_seconds_to_target",
    "ratio_to_reference", "target_step", "recipe_cost_to_target_usd", "recipe_cost_low_usd",
    "recipe_cost_high_usd", "recipe_ratio_to_reference", "steps_to_target", "flops_to_target",
    "step_seconds", "step_seconds_spread", "step_time_varied", "recipe_usd_per_step", "halted",
    "note", "replicate", "seed", "timing_calibrated", "own_step_seconds", "quantized_val_loss",
    "final_quantized_val_loss", "best_quantized_val_loss")
# A variant over its replicates (VariantSummary fields, in this order): the
# means with their 90% intervals, and the verdict.
SUMMARY_COLUMNS = (
    "name", "replicates", "reached_target", "steps_to_target", "steps_ci90_low",
    "steps_ci90_high", "tokens_to_target", "tokens_ci90_low", "tokens_ci90_high",
    "recipe_cost_to_target_usd", "recipe_cost_ci90_low_usd", "recipe_cost_ci90_high_usd",
    "recipe_ratio_to_reference", "recipe_ratio_ci90_low", "recipe_ratio_ci90_high",
    "ratio_pairs", "cost_to_target_usd", "verdict")
TRAIN_COLUMNS = ("step", "tokens", "train_loss", "attempt")
EVAL_COLUMNS = ("step", "tokens", "cost_usd", "gpu_seconds", "val_loss", "quantized_val_loss")
# Fields that may be absent (proto3 optional: a job or variant not evaluated
# quantized has no quantized loss): NaN in rows and DataFrames, never 0.
OPTIONAL_COLUMNS = frozenset(("quantized_val_loss", "final_quantized_val_loss",
                              "best_quantized_val_loss"))


# Figures tallyd leaves at 0 while they are unknown (a running variant's
# final loss, dollars to a target not reached, a recipe price not yet
# measured): NaN in rows and DataFrames, so min() and mean() skip them.
UNKNOWN_WHEN_ZERO = frozenset((
    "val_loss", "final_val_loss", "best_val_loss", "ratio_to_reference",
    "recipe_cost_to_target_usd", "recipe_cost_low_usd", "recipe_cost_high_usd",
    "recipe_ratio_to_reference", "step_seconds", "step_seconds_spread", "recipe_usd_per_step",
    "own_step_seconds", "steps_ci90_low", "steps_ci90_high", "tokens_ci90_low",
    "tokens_ci90_high", "recipe_cost_ci90_low_usd", "recipe_cost_ci90_high_usd",
    "recipe_ratio_ci90_low", "recipe_ratio_ci90_high"))
# Figures to the target: NaN while the target is not reached.
TO_TARGET_COLUMNS = frozenset((
    "cost_to_target_usd", "tokens_to_target", "gpu_seconds_to_target", "target_step",
    "steps_to_target", "flops_to_target", "recipe_cost_to_target_usd"))


def _value(message: Any, column: str) -> Any:
    if column in OPTIONAL_COLUMNS and not message.HasField(column):
        return math.nan
    value = getattr(message, column)
    if column in TO_TARGET_COLUMNS and not getattr(message, "reached_target", True):
        return math.nan
    if column in UNKNOWN_WHEN_ZERO and value == 0:
        return math.nan
    return value


def loss_of(point: Any, metric: str) -> float:
    """A point's (an EvalPoint's, a VariantStatus's, a Checkpoint's) loss of
    ``metric``: ``"val_loss"`` (or empty) or ``"quantized_val_loss"``, NaN
    when it has no quantized loss."""
    if metric == "quantized_val_loss":
        return point.quantized_val_loss if point.HasField("quantized_val_loss") else math.nan
    return float(point.val_loss)


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("to_dataframe() needs pandas: pip install 'tally-client[pandas]'") \
            from None
    return pandas


def run_name(v: experiments_pb2.VariantStatus) -> str:
    """A run's name: the variant's, with "#r" for replicate r > 1 of it."""
    return v.name if v.replicate <= 1 else "%s#%d" % (v.name, v.replicate)


def _state(v: experiments_pb2.VariantStatus) -> str:
    return jobs_pb2.JobState.Name(v.state).removeprefix("JOB_STATE_")


@dataclasses.dataclass(frozen=True)
class ExperimentReport:
    """An experiment's variant table as tallyd computed it, with each
    variant's evaluation curve (what the loss-against-dollars plot draws).

    Attributes:
        experiment: The experiment as GetExperiment returned it.
        curves: Each variant's evaluations (its job's ``curve``), by name;
            variants not yet submitted have none.
    """

    experiment: experiments_pb2.Experiment
    curves: Mapping[str, Sequence[jobs_pb2.EvalPoint]] = dataclasses.field(default_factory=dict)

    @property
    def variants(self) -> list[experiments_pb2.VariantStatus]:
        """The variants' figures, in the experiment file's order."""
        return list(self.experiment.variants)

    @property
    def target_val_loss(self) -> float:
        """The target every variant is judged against (0 until known), a loss
        of ``metric``."""
        return self.experiment.target_val_loss

    @property
    def metric(self) -> str:
        """What the target is of and the variants are judged by:
        ``"val_loss"`` or ``"quantized_val_loss"`` (spec.target.metric)."""
        return self.experiment.spec.target.metric or "val_loss"

    def rows(self) -> list[dict[str, Any]]:
        """One dict per variant with VARIANT_COLUMNS as keys (the state as
        its short name, e.g. "SUCCEEDED"); a figure not known (yet) is NaN,
        never 0: a quantized loss the variant does not have, the final loss
        of a variant still running, figures to a target it has not reached,
        recipe dollars before its step times are measured."""
        out = []
        for v in self.experiment.variants:
            row: dict[str, Any] = {c: _value(v, c) for c in VARIANT_COLUMNS}
            row["state"] = _state(v)
            out.append(row)
        return out

    def to_dataframe(self) -> Any:
        """The variant table as a pandas DataFrame indexed by variant name
        (needs the ``pandas`` extra); with replicates, one row per run,
        indexed by (name, replicate)."""
        pd = _pandas()
        df = pd.DataFrame(self.rows(), columns=list(VARIANT_COLUMNS))
        if self.experiment.spec.replicates > 1:
            return df.set_index(["name", "replicate"])
        return df.set_index("name")

    def summary_rows(self) -> list[dict[str, Any]]:
        """One dict per variant with SUMMARY_COLUMNS as keys: the means over
        its replicates, their 90% intervals and the verdict (NaN where not
        known, as in rows())."""
        return [{c: _value(s, c) for c in SUMMARY_COLUMNS} for s in self.experiment.summaries]

    def summary_dataframe(self) -> Any:
        """summary_rows() as a pandas DataFrame indexed by variant name."""
        pd = _pandas()
        return pd.DataFrame(self.summary_rows(), columns=list(SUMMARY_COLUMNS)).set_index("name")

    def table(self) -> str:
        """The table as text: each variant's state, losses and dollars to the
        target (recipe and billed) and the ratio to the reference."""
        e = self.experiment
        quantized = self.metric == "quantized_val_loss"
        head = "%s  %s" % (e.name, e.spec.display_name) if e.spec.display_name else e.name
        lines = [head.strip(),
                 "target %s: %s   reference: %s   spent: $%.4f" % (
                     "quantized_val_loss" if quantized else "val loss",
                     "%.4f" % e.target_val_loss if e.target_val_loss > 0 else "-",
                     e.reference_variant or "-", e.cost_usd),
                 "%-20s %-17s %-9s %-9s %-10s %-12s %-12s %-7s %s" % (
                     "VARIANT", "STATE", "FINAL Q" if quantized else "FINAL",
                     "BEST Q" if quantized else "BEST", "SPENT", "RECIPE_$", "BILLED_$",
                     "RATIO", "NOTE")]

        def loss(value: float) -> str:
            return "%.4f" % value if value > 0 else "-"  # NaN > 0 is False
        for v in e.variants:
            lines.append("%-20s %-17s %-9s %-9s %-10s %-12s %-12s %-7s %s" % (
                run_name(v), _state(v),
                loss(_value(v, "final_quantized_val_loss") if quantized else v.final_val_loss),
                loss(_value(v, "best_quantized_val_loss") if quantized else v.best_val_loss),
                "$%.4f" % v.cost_usd,
                "$%.4f" % v.recipe_cost_to_target_usd if v.recipe_cost_to_target_usd > 0 else "-",
                "$%.4f" % v.cost_to_target_usd if v.reached_target else "-",
                "%.2fx" % v.recipe_ratio_to_reference if v.recipe_ratio_to_reference > 0 else "-",
                v.note))
        if e.spec.replicates > 1:
            lines.append("over %d replicates (mean and 90%% interval):" % e.spec.replicates)
            lines.append("%-20s %-8s %-32s %-22s %s" % (
                "VARIANT", "REACHED", "RECIPE_$ (90%)", "RATIO (90%)", "VERDICT"))
            for su in e.summaries:
                lines.append("%-20s %-8s %-32s %-22s %s" % (
                    su.name, "%d/%d" % (su.reached_target, su.replicates),
                    "$%.4f ($%.4f-$%.4f)" % (su.recipe_cost_to_target_usd,
                                              su.recipe_cost_ci90_low_usd,
                                              su.recipe_cost_ci90_high_usd)
                    if su.recipe_cost_to_target_usd > 0 else "-",
                    "%.2fx (%.2fx-%.2fx)" % (su.recipe_ratio_to_reference,
                                             su.recipe_ratio_ci90_low,
                                             su.recipe_ratio_ci90_high)
                    if su.ratio_pairs > 0 else "-",
                    su.verdict))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


@dataclasses.dataclass(frozen=True)
class EvalHistory:
    """A job's evaluations with what it had spent at each (Job.curve).

    Attributes:
        job: The job's name ("jobs/N").
        points: The evaluations, oldest first.
    """

    job: str
    points: Sequence[jobs_pb2.EvalPoint]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per evaluation with EVAL_COLUMNS as keys
        (quantized_val_loss is NaN for an evaluation without one)."""
        return [{c: _value(p, c) for c in EVAL_COLUMNS} for p in self.points]

    def to_dataframe(self) -> Any:
        """The evaluations as a pandas DataFrame (needs the ``pandas``
        extra), one row per evaluation, columns EVAL_COLUMNS
        (quantized_val_loss NaN where the job was not evaluated quantized)."""
        pd = _pandas()
        return pd.DataFrame(self.rows(), columns=list(EVAL_COLUMNS))


@dataclasses.dataclass(frozen=True)
class TrainHistory:
    """A job's training loss at each reported step, as tallyd keeps it
    (Job.train_curve: every reported step up to 2048 points, then an even
    sample every ``every`` steps).

    Attributes:
        job: The job's name ("jobs/N").
        points: The points, oldest first.
        every: Steps between kept points once thinned; 0 while every
            reported step is kept.
    """

    job: str
    points: Sequence[jobs_pb2.TrainPoint]
    every: int = 0

    def rows(self) -> list[dict[str, Any]]:
        """One dict per reported step with TRAIN_COLUMNS as keys."""
        return [{c: getattr(p, c) for c in TRAIN_COLUMNS} for p in self.points]

    def to_dataframe(self) -> Any:
        """The points as a pandas DataFrame (needs the ``pandas`` extra), one
        row per step, columns TRAIN_COLUMNS."""
        pd = _pandas()
        return pd.DataFrame(self.rows(), columns=list(TRAIN_COLUMNS))
