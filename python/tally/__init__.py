"""Tally's Python client: submit and watch training jobs, run recipe
experiments and compare what each recipe spends to reach a target loss.

    import tally
    with tally.Client.from_config() as client:
        job = client.submit("examples/jobs/tiny.yaml")
        for event in client.watch(job):
            print(event.sequence, event.type, event.step, event.val_loss)

Results are the API's protobuf messages (tally.v1.Job, JobEvent,
Experiment, ...); tables are ExperimentReport and EvalHistory. ``tally.aio``
has the same client for asyncio.
"""

from __future__ import annotations

import os as _os
import sys as _sys


def _import_grpc_quietly() -> None:
    # gRPC's C core logs failed handshakes and the like to stderr on its own;
    # this package says what failed in its exceptions. The C core reads
    # GRPC_VERBOSITY once, when grpc is first imported, so it is set for that
    # import only (child processes do not inherit it); GRPC_VERBOSITY or
    # GRPC_TRACE set by the user, or grpc imported before tally, win.
    if "grpc" in _sys.modules or "GRPC_VERBOSITY" in _os.environ \
            or "GRPC_TRACE" in _os.environ:
        return
    _os.environ["GRPC_VERBOSITY"] = "NONE"
    try:
        import grpc  # noqa: F401
    finally:
        _os.environ.pop("GRPC_VERBOSITY", None)


_import_grpc_quietly()

from typing import Any  # noqa: E402

from tally._client import Client, Experiments, Jobs
from tally._common import ExperimentRef, JobRef
from tally._display import (JobState, experiment_summary, job_summary, register_ipython,
                            state_name)
from tally._config import Connection, resolve_connection
from tally._errors import (AlreadyExists, ConfigError, DeadlineExceeded, FailedPrecondition,
                           InvalidSpec, NotFound, PermissionDenied, ResourceExhausted,
                           TallyError, Unauthenticated, Unavailable)
from tally._logs import LogLine
from tally._report import EvalHistory, ExperimentReport, TrainHistory
from tally._spec import (ExperimentSpecInput, JobSpecInput, load_experiment_spec,
                         load_job_spec)
from tally.v1 import experiments_pb2, jobs_pb2, spec_pb2

__version__ = "0.1.0"

__all__ = [
    "Client", "Jobs", "Experiments", "Connection", "resolve_connection",
    "TallyError", "ConfigError", "InvalidSpec", "NotFound", "AlreadyExists", "PermissionDenied",
    "Unauthenticated", "FailedPrecondition", "ResourceExhausted", "Unavailable",
    "DeadlineExceeded", "ExperimentReport", "EvalHistory", "TrainHistory", "load_job_spec",
    "load_experiment_spec", "plot_loss_vs_dollars", "jobs_pb2", "experiments_pb2", "spec_pb2",
    "JobState", "state_name", "job_summary", "experiment_summary", "JobRef", "ExperimentRef",
    "JobSpecInput", "ExperimentSpecInput", "LogLine",
]

# In a notebook, Job and Experiment messages show as a line and a table.
register_ipython()


def plot_loss_vs_dollars(experiment: Any, client: Any = None, *, billed: bool = False,
                         zoom: bool = True, ax: Any = None) -> Any:
    """Validation loss against dollars for every variant, the picture of
    ``tallyctl experiment report --svg``, drawn with matplotlib (the
    ``plot`` extra); returns the Figure. See tally.plot."""
    from tally.plot import plot_loss_vs_dollars as plot
    return plot(experiment, client, billed=billed, zoom=zoom, ax=ax)
