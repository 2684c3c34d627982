"""What ``wait(progress=True)`` shows while a job or an experiment runs: a
tqdm bar (steps with the losses and dollars; variants ended) when tqdm is
installed, nothing otherwise. Shared by the synchronous and asyncio
clients."""

from __future__ import annotations

import math
from typing import Any

from tally._display import state_name
from tally._errors import DeadlineExceeded
from tally.v1 import experiments_pb2, jobs_pb2

__all__ = ["JobProgress", "ExperimentProgress", "wait_timed_out"]


def _tqdm(enabled: bool, **kwargs: Any) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(**kwargs)


class JobProgress:
    """A bar of the job's steps (of max_steps), with the latest train and
    validation loss and the dollars spent as its postfix."""

    def __init__(self, job: jobs_pb2.Job, enabled: bool) -> None:
        total = job.spec.training.max_steps or None
        self._bar = _tqdm(enabled, total=total, desc=job.name, unit="step", dynamic_ncols=True)
        self._figures: dict[str, str] = {}
        self.update(job.step, job.train_loss, job.val_loss, job.cost.cost_usd,
                    state_name(job))

    def update(self, step: int, train_loss: float, val_loss: float, cost_usd: float,
               state: str) -> None:
        if self._bar is None:
            return
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        if math.isfinite(train_loss) and train_loss > 0:
            self._figures["loss"] = "%.4f" % train_loss
        if math.isfinite(val_loss) and val_loss > 0:
            self._figures["val_loss"] = "%.4f" % val_loss
        if math.isfinite(cost_usd) and cost_usd > 0:
            self._figures["$"] = "%.4f" % cost_usd
        self._bar.set_postfix(dict(self._figures, state=state), refresh=False)

    def event(self, e: jobs_pb2.JobEvent) -> None:
        """Moves the bar by one of the job's events."""
        self.update(e.step, e.train_loss, e.val_loss, e.cost_usd, state_name(e))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ExperimentProgress:
    """A bar of the experiment's variants that have ended."""

    def __init__(self, exp: experiments_pb2.Experiment, enabled: bool) -> None:
        self._bar = _tqdm(enabled, total=len(exp.spec.variants) * max(1, exp.spec.replicates)
                          or None, desc=exp.name, unit="variant", dynamic_ncols=True)

    def event(self, e: experiments_pb2.ExperimentEvent) -> None:
        if self._bar is None:
            return
        if e.type == "variant_ended":
            self._bar.update(1)
        self._bar.set_postfix(state=experiments_pb2.ExperimentState.Name(e.state)
                              .removeprefix("EXPERIMENT_STATE_"), refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def wait_timed_out(name: str, timeout: float, state: str, detail: str,
                   cause: Exception) -> DeadlineExceeded:
    """The error of a wait that ran out of time: what it waited for, for how
    long, and where it stands."""
    address = getattr(cause, "address", "")
    return DeadlineExceeded("%s has not ended within %gs: %s%s (wait again, or give a longer "
                            "timeout)" % (name, timeout, state, detail),
                            getattr(cause, "code", None), address)
