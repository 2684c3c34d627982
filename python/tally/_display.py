"""How jobs and experiments look in a notebook or a REPL: state names, a
one-line summary in place of the message's full text (a job's is several
kilobytes), and an HTML table with a sparkline of the validation curve.

The API's messages are protobuf classes, which cannot be subclassed; so
IPython is taught to show them (``register_ipython``, done when tally is
imported in an IPython kernel), and the same words are available as
functions everywhere else."""

from __future__ import annotations

import enum
import html
import math
import sys
from collections.abc import Sequence
from typing import Any

from tally.v1 import experiments_pb2, jobs_pb2

__all__ = ["JobState", "state_name", "job_summary", "job_html", "experiment_summary", "experiment_html",
           "sparkline_svg", "register_ipython"]

class JobState(enum.IntEnum):
    """A job's state by name: ``tally.JobState(job.state)`` prints as
    ``SUCCEEDED`` and equals the message's number (``jobs_pb2`` constants)."""

    UNSPECIFIED = jobs_pb2.JOB_STATE_UNSPECIFIED
    QUEUED = jobs_pb2.JOB_STATE_QUEUED
    RUNNING = jobs_pb2.JOB_STATE_RUNNING
    SUCCEEDED = jobs_pb2.JOB_STATE_SUCCEEDED
    EARLY_STOPPED = jobs_pb2.JOB_STATE_EARLY_STOPPED
    BUDGET_EXHAUSTED = jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED
    CANCELLED = jobs_pb2.JOB_STATE_CANCELLED
    FAILED = jobs_pb2.JOB_STATE_FAILED

    def __str__(self) -> str:
        return self.name

    @property
    def ended(self) -> bool:
        """Whether a job in this state has ended (it will not run again)."""
        return self >= JobState.SUCCEEDED


StateLike = (jobs_pb2.Job | jobs_pb2.JobEvent | experiments_pb2.Experiment
             | experiments_pb2.VariantStatus | int)


def state_name(x: StateLike) -> str:
    """The state of a Job, JobEvent, Experiment or VariantStatus (or a
    JobState number) as its short name: "QUEUED", "RUNNING", "SUCCEEDED",
    "EARLY_STOPPED", "BUDGET_EXHAUSTED", "CANCELLED", "FAILED" (an
    experiment's: its ExperimentState without the prefix)."""
    if isinstance(x, experiments_pb2.Experiment):
        return experiments_pb2.ExperimentState.Name(x.state).removeprefix("EXPERIMENT_STATE_")
    if isinstance(x, (jobs_pb2.Job, jobs_pb2.JobEvent, experiments_pb2.VariantStatus)):
        number = int(x.state)
    elif isinstance(x, int) and not isinstance(x, bool):
        number = x
    else:
        raise TypeError("state_name: expected a Job, JobEvent, Experiment, VariantStatus or a "
                        "JobState number, got %s" % type(x).__name__)
    try:
        return jobs_pb2.JobState.Name(number).removeprefix("JOB_STATE_")
    except ValueError:
        return str(number)


def _loss(v: float) -> str:
    return "%.4f" % v if math.isfinite(v) and v > 0 else "-"


def job_summary(job: jobs_pb2.Job) -> str:
    """One line: name, display name, state, step of max_steps, the latest
    validation loss and the dollars spent."""
    parts = [job.name or "jobs/?"]
    if job.spec.display_name:
        parts.append(repr(job.spec.display_name))
    parts.append(state_name(job))
    steps = "step %d" % job.step
    if job.spec.training.max_steps:
        steps += "/%d" % job.spec.training.max_steps
    parts.append(steps)
    parts.append("val_loss " + _loss(job.val_loss))
    parts.append("$%.4f" % job.cost.cost_usd)
    return "<tally Job %s>" % " ".join(parts)


def experiment_summary(exp: experiments_pb2.Experiment) -> str:
    """One line: name, display name, state, variants, target and dollars."""
    parts = [exp.name or "experiments/?"]
    if exp.spec.display_name:
        parts.append(repr(exp.spec.display_name))
    parts.append(state_name(exp))
    parts.append("%d variants" % len(exp.variants))
    parts.append("target " + _loss(exp.target_val_loss))
    parts.append("$%.4f" % exp.cost_usd)
    return "<tally Experiment %s>" % " ".join(parts)


def sparkline_svg(values: Sequence[float], width: int = 120, height: int = 24) -> str:
    """A small inline SVG polyline of ``values`` (the finite ones), or "" for
    fewer than two."""
    ys = [v for v in values if math.isfinite(v)]
    if len(ys) < 2:
        return ""
    lo, hi = min(ys), max(ys)
    span = hi - lo or 1.0
    points = " ".join("%.1f,%.1f" % (i * (width - 2) / (len(ys) - 1) + 1,
                                     (hi - y) / span * (height - 4) + 2)
                      for i, y in enumerate(ys))
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d">'
            '<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/></svg>'
            % (width, height, points))


def _table(rows: Sequence[tuple[str, str]]) -> str:
    return "".join("<tr><th style='text-align:left'>%s</th><td style='text-align:left'>%s</td>"
                   "</tr>" % (html.escape(k), v) for k, v in rows)


def job_html(job: jobs_pb2.Job) -> str:
    """An HTML table: state (and why), step, the latest validation loss with
    a sparkline of the curve, dollars."""
    state = html.escape(state_name(job))
    if job.state_reason:
        state += " <small>(%s)</small>" % html.escape(job.state_reason)
    steps = "%d" % job.step + ("/%d" % job.spec.training.max_steps
                               if job.spec.training.max_steps else "")
    rows = [("state", state), ("step", steps),
            ("val loss", html.escape(_loss(job.val_loss)) + " "
             + sparkline_svg([p.val_loss for p in job.curve])),
            ("dollars", "$%.4f" % job.cost.cost_usd)]
    title = html.escape(job.name + ("  " + job.spec.display_name if job.spec.display_name else ""))
    return "<table><caption style='text-align:left'><b>%s</b></caption>%s</table>" % (
        title, _table(rows))


def experiment_html(exp: experiments_pb2.Experiment) -> str:
    """An HTML table of the experiment's variants: state, final loss, dollars
    spent and recipe dollars to the target."""
    head = "".join("<th>%s</th>" % h for h in ("variant", "state", "final val loss", "spent",
                                                "recipe $ to target"))
    body = "".join(
        "<tr><td>%s</td><td>%s</td><td>%s</td><td>$%.4f</td><td>%s</td></tr>" % (
            html.escape(v.name), state_name(v), _loss(v.final_val_loss), v.cost_usd,
            "$%.4f" % v.recipe_cost_to_target_usd if v.recipe_cost_to_target_usd > 0 else "-")
        for v in exp.variants)
    title = html.escape("%s  %s  %s  target %s  $%.4f" % (
        exp.name, exp.spec.display_name, state_name(exp), _loss(exp.target_val_loss),
        exp.cost_usd))
    return ("<table><caption style='text-align:left'><b>%s</b></caption><tr>%s</tr>%s</table>"
            % (title, head, body))


def register_ipython() -> bool:
    """Teaches a running IPython to show Job and Experiment messages by their
    summary (text) and table (HTML). Returns whether there was one."""
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return False
    shell = ipython_module.get_ipython()
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters

    def text(summary: Any) -> Any:
        return lambda obj, p, cycle: p.text(summary(obj))

    formatters["text/plain"].for_type(jobs_pb2.Job, text(job_summary))
    formatters["text/plain"].for_type(experiments_pb2.Experiment, text(experiment_summary))
    formatters["text/html"].for_type(jobs_pb2.Job, job_html)
    formatters["text/html"].for_type(experiments_pb2.Experiment, experiment_html)
    return True
