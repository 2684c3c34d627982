"""Validation loss (or, for an experiment judged by it, the quantized
validation loss) against dollars with matplotlib: the picture of
``tallyctl experiment report --svg`` (cli/tallyctl/experiment_report.h),
with the same axes, colours, target line, crossings and legend."""

from __future__ import annotations

import io
import math
from typing import Any

from tally._report import ExperimentReport, loss_of, run_name
from tally.v1 import experiments_pb2

__all__ = ["plot_loss_vs_dollars", "PALETTE"]

# Tableau 10, in tallyctl's order; variants past the tenth are dashed.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
_MAX = 1e100


def _ok(v: float) -> bool:
    return math.isfinite(v) and abs(v) <= _MAX


def _dollars(v: float) -> str:
    return ("-$" if v < 0 else "$") + ("%.3g" % abs(v) if abs(v) < 1 else "%.2f" % abs(v))


_FIGURE_CLASS: Any = None


def _figure_class() -> Any:
    """matplotlib's Figure that shows itself as a PNG where it is
    displayed (a notebook cell's last expression) without pyplot: a Figure
    no backend manages is otherwise shown as ``<Figure size ...>``."""
    global _FIGURE_CLASS
    if _FIGURE_CLASS is None:
        from matplotlib.figure import Figure

        class LossFigure(Figure):
            def _repr_png_(self) -> bytes:
                buf = io.BytesIO()
                self.savefig(buf, format="png", bbox_inches="tight")
                return buf.getvalue()

        _FIGURE_CLASS = LossFigure
    return _FIGURE_CLASS


def plot_loss_vs_dollars(experiment: Any, client: Any = None, *, billed: bool = False,
                         zoom: bool = True, ax: Any = None) -> Any:
    """Draws every variant's validation loss against what it had spent at
    each evaluation and returns the matplotlib Figure.

    Args:
        experiment: An ExperimentReport (``client.experiments.report(...)``),
            or an Experiment / its name with ``client`` to fetch the report.
        client: A tally.Client, when ``experiment`` is not a report.
        billed: x is what tallyd billed; default recipe dollars (each
            evaluation's step times the variant's recipe price per step)
            when every variant has one, as tallyctl's --svg_x=recipe.
        zoom: y is the region around the target (tallyctl's --svg_y=target);
            False: every loss.
        ax: The Axes to draw on; default a new Figure's.
    """
    # A Figure of its own, not pyplot's: no backend is chosen or changed
    # (scripts save it; a notebook shows the returned Figure once, by its
    # PNG, as a cell's last expression).
    report = experiment
    if not isinstance(report, ExperimentReport):
        if client is None:
            raise ValueError("plot_loss_vs_dollars: give an ExperimentReport, or a client too")
        report = client.experiments.report(experiment)
    e: experiments_pb2.Experiment = report.experiment
    names = [run_name(v) for v in e.variants]
    names += [n for n in report.curves if n not in names]
    status = {run_name(v): v for v in e.variants}

    metric = report.metric
    any_loss = any(_ok(loss_of(p, metric)) for c in report.curves.values() for p in c)
    any_cost = any(_ok(loss_of(p, metric)) and _ok(p.cost_usd) and p.cost_usd > 0
                   for c in report.curves.values() for p in c)
    tokens = any_loss and not any_cost
    recipe = not tokens and not billed
    for n, c in report.curves.items():
        if c:
            s = status.get(n)
            recipe = recipe and s is not None and _ok(s.recipe_usd_per_step) \
                and s.recipe_usd_per_step > 0
    axis = "tokens" if tokens else "recipe" if recipe else "billed"

    def x_of(name: str, p: Any) -> float:
        if axis == "tokens":
            return float(p.tokens)
        if axis == "recipe":
            return float(p.step * status[name].recipe_usd_per_step)
        return float(p.cost_usd)

    def to_target(v: experiments_pb2.VariantStatus) -> float:
        return (v.tokens_to_target if axis == "tokens" else
                v.recipe_cost_to_target_usd if axis == "recipe" else v.cost_to_target_usd)

    fig = ax.figure if ax is not None else _figure_class()(figsize=(8.8, 4.8))
    if ax is None:
        ax = fig.add_axes((0.1, 0.14, 0.6, 0.72))
    target = e.target_val_loss if _ok(e.target_val_loss) and e.target_val_loss > 0 else 0.0
    y_max = -math.inf
    y_min = math.inf
    for i, n in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        style = "--" if i >= len(PALETTE) else "-"
        pts = [(x_of(n, p), loss_of(p, metric)) for p in report.curves.get(n, ())
               if _ok(loss_of(p, metric)) and _ok(x_of(n, p))]
        v = status.get(n)
        if pts:
            detail = "latest loss %.4f" % pts[-1][1]
            if target > 0:
                if v is not None and v.reached_target:
                    t = to_target(v)
                    detail = ("%s tokens to target" % format(t, ".3g") if tokens
                              else "%s to target" % _dollars(t))
                else:
                    detail = (v.note if v is not None and v.note else "target not reached")
        else:
            detail = v.note if v is not None and v.note else "no evaluations yet"
        if v is not None and v.halted:
            detail += " (halted)"
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        y_max = max([y_max] + ys)
        y_min = min([y_min] + ys)
        ax.plot(xs, ys, style, color=color, linewidth=2, marker="o" if len(pts) == 1 else None,
                label="%s\n%s" % (n, detail))
        if target > 0 and v is not None and v.reached_target and _ok(to_target(v)):
            ax.plot([to_target(v)], [target], "o", markersize=8, markerfacecolor="white",
                    markeredgecolor=color, markeredgewidth=2.5)
    if target > 0:
        ax.axhline(target, color="#333333", linewidth=1.5, linestyle=(0, (6, 4)))
        ax.annotate("target %.4f" % target, xy=(0.01, target), xycoords=("axes fraction", "data"),
                    xytext=(6, 5), textcoords="offset points", fontsize=9)
        if zoom and y_max > 1.35 * target:
            ax.set_ylim(min(y_min, target) - 0.02 * target, 1.35 * target)
    ax.set_xlim(left=0)
    ax.set_xlabel({"tokens": "tokens trained (no evaluation has a dollar cost)",
                   "recipe": "recipe dollars (steps x each variant's median step time x its "
                             "price)",
                   "billed": "dollars billed (USD)" if billed else
                   "dollars billed (USD; a variant has no step times for recipe dollars)"}[axis])
    quantized = metric == "quantized_val_loss"
    ax.set_ylabel("quantized validation loss" if quantized else "validation loss")
    title = ("%s (%s)" % (e.spec.display_name, e.name) if e.spec.display_name and e.name
             else e.spec.display_name or e.name or "Experiment")
    facts = [experiments_pb2.ExperimentState.Name(e.state).removeprefix("EXPERIMENT_STATE_")
             .lower().replace("_", " ")]
    facts.append("target %s %.4f" % ("quantized_val_loss" if quantized else "val loss", target)
                 if target > 0 else "no target yet")
    if _ok(e.cost_usd) and e.cost_usd > 0:
        facts.append("%s spent" % _dollars(e.cost_usd))
    ax.set_title("%s\n%s" % (title, " \u00b7 ".join(facts)), loc="left", fontsize=11)
    ax.grid(True, color="#e4e4e4")
    if not any_loss:
        ax.text(0.5, 0.5, "no evaluations yet", transform=ax.transAxes, ha="center",
                color="#666666")
    if names:
        ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False, fontsize=9)
    return fig
