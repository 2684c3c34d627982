"""What the synchronous and asyncio clients share: the methods' paths and
message types, request building, channel options and the retry rules."""

from __future__ import annotations

import datetime
import random
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Union

import grpc

from tally._config import Connection, is_loopback, resolve_connection
from tally.v1 import experiments_pb2, jobs_pb2

# Unary calls: sent again (to the next address, then after a backoff) only
# while tallyd answers UNAVAILABLE. Streams also resume after CANCELLED,
# which the client never asks for: the tallyd serving the stream went away.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
STREAM_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
WATCH_ESTABLISHED_KEY = "tally-watch-established"

# (path, request type, response type) of every method.
METHODS: dict[str, tuple[str, Any, Any]] = {
    "SubmitJob": ("/tally.v1.Jobs/SubmitJob", jobs_pb2.SubmitJobRequest, jobs_pb2.Job),
    "GetJob": ("/tally.v1.Jobs/GetJob", jobs_pb2.GetJobRequest, jobs_pb2.Job),
    "ListJobs": ("/tally.v1.Jobs/ListJobs", jobs_pb2.ListJobsRequest, jobs_pb2.ListJobsResponse),
    "CancelJob": ("/tally.v1.Jobs/CancelJob", jobs_pb2.CancelJobRequest, jobs_pb2.Job),
    "WatchJob": ("/tally.v1.Jobs/WatchJob", jobs_pb2.WatchJobRequest, jobs_pb2.JobEvent),
    "ListCheckpoints": ("/tally.v1.Jobs/ListCheckpoints", jobs_pb2.ListCheckpointsRequest,
                        jobs_pb2.ListCheckpointsResponse),
    "EstimateCost": ("/tally.v1.Jobs/EstimateCost", jobs_pb2.EstimateCostRequest,
                     jobs_pb2.CostEstimate),
    "GetJobLogs": ("/tally.v1.Jobs/GetJobLogs", jobs_pb2.GetJobLogsRequest,
                   jobs_pb2.GetJobLogsResponse),
    "WatchJobLogs": ("/tally.v1.Jobs/WatchJobLogs", jobs_pb2.WatchJobLogsRequest,
                     jobs_pb2.LogLine),
    "CreateExperiment": ("/tally.v1.Experiments/CreateExperiment",
                         experiments_pb2.CreateExperimentRequest, experiments_pb2.Experiment),
    "GetExperiment": ("/tally.v1.Experiments/GetExperiment", experiments_pb2.GetExperimentRequest,
                      experiments_pb2.Experiment),
    "ListExperiments": ("/tally.v1.Experiments/ListExperiments",
                        experiments_pb2.ListExperimentsRequest,
                        experiments_pb2.ListExperimentsResponse),
    "CancelExperiment": ("/tally.v1.Experiments/CancelExperiment",
                         experiments_pb2.CancelExperimentRequest, experiments_pb2.Experiment),
    "WatchExperiment": ("/tally.v1.Experiments/WatchExperiment",
                        experiments_pb2.WatchExperimentRequest, experiments_pb2.ExperimentEvent),
}

class ConnectFailure(grpc.RpcError):
    """A watch that found no tallyd within the connect timeout, as an
    UNAVAILABLE status for the clients' error mapping."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


def connect_failure(timeout: float, details: str | None) -> ConnectFailure:
    """What a watch says when tallyd did not take it within ``timeout``."""
    return ConnectFailure("the watch got no answer within %gs%s"
                          % (timeout, ": " + details if details else ""))


TERMINAL_JOB_STATES = frozenset({
    jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_EARLY_STOPPED,
    jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED, jobs_pb2.JOB_STATE_CANCELLED, jobs_pb2.JOB_STATE_FAILED})


JobRef = Union[str, int, jobs_pb2.Job]
"""A job: its name ("jobs/N"), its number (N or "N"), or the Job itself."""
ExperimentRef = Union[str, int, experiments_pb2.Experiment]
"""An experiment: "experiments/N", N or "N", or the Experiment itself."""


def _name_of(ref: object, collection: str, message: type, what: str) -> str:
    if isinstance(ref, message):
        name: str = ref.name  # type: ignore[attr-defined]
        return name
    if isinstance(ref, int) and not isinstance(ref, bool):
        number = str(ref)
    elif isinstance(ref, str):
        number = ref.strip().removeprefix(collection + "/")
    else:
        raise TypeError("%s: expected %s/N, a number or a %s, got %s %.60r" % (
            what, collection, message.__name__, type(ref).__name__, ref))
    if not number.isascii() or not number.isdigit():
        from tally._errors import InvalidSpec
        raise InvalidSpec("name: %.60r is not a %s name; give %s/N or the number N"
                          % (ref, what, collection), field="name")
    return "%s/%s" % (collection, number)


def job_name(job: JobRef) -> str:
    """"jobs/N" from a Job, "jobs/N", "N" or N; TypeError for anything else
    (a dict, an event, an experiment), ValueError for a malformed name."""
    return _name_of(job, "jobs", jobs_pb2.Job, "job")


def experiment_name(exp: ExperimentRef) -> str:
    """"experiments/N" from an Experiment, "experiments/N", "N" or N;
    TypeError for anything else."""
    return _name_of(exp, "experiments", experiments_pb2.Experiment, "experiment")


def new_request_id() -> str:
    """A fresh idempotency key, as tallyctl makes them."""
    return "tally-py-%032x" % random.SystemRandom().getrandbits(128)


def job_states(states: Iterable[str | int] | None) -> list[int]:
    """JobState numbers from names ("queued", "JOB_STATE_QUEUED") or numbers."""
    out: list[int] = []
    for s in states or ():
        if isinstance(s, int):
            out.append(s)
            continue
        full = s.upper() if s.upper().startswith("JOB_STATE_") else "JOB_STATE_" + s.upper()
        try:
            out.append(jobs_pb2.JobState.Value(full))
        except ValueError:
            from tally._errors import InvalidSpec
            raise InvalidSpec("states: unknown state %r; use queued, running, succeeded, "
                              "early_stopped, budget_exhausted, cancelled, failed" % s,
                              field="states") from None
    return out


TimeBound = Union[datetime.datetime, datetime.timedelta, None]
"""A creation-time bound: a datetime (naive ones are local time, as
datetime.astimezone reads them) or a timedelta before now."""


def list_jobs_request(states: Iterable[str | int] | None, tenant: str, page_size: int,
                      labels: Mapping[str, str] | None, name_prefix: str,
                      created_after: TimeBound,
                      created_before: TimeBound) -> jobs_pb2.ListJobsRequest:
    """A ListJobsRequest of the filters (tallyd filters; pages may be short)."""
    numbers: Any = job_states(states)
    req = jobs_pb2.ListJobsRequest(page_size=page_size, states=numbers, tenant=tenant,
                                   display_name_prefix=name_prefix)
    for key, value in (labels or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            from tally._errors import InvalidSpec
            raise InvalidSpec("labels: %r=%r: keys and values are strings" % (key, value),
                              field="labels")
        req.labels[key] = value
    now = datetime.datetime.now(datetime.timezone.utc)
    for field, bound in (("created_after", created_after), ("created_before", created_before)):
        if bound is None:
            continue
        if isinstance(bound, datetime.timedelta):
            at = now - bound
        elif isinstance(bound, datetime.datetime):
            at = bound.astimezone(datetime.timezone.utc)
        else:
            raise TypeError("%s: expected a datetime or a timedelta (that long ago), got %s"
                            % (field, type(bound).__name__))
        getattr(req, field).FromDatetime(at)
    return req


def client_connection(controller: str | None, *, token: str | None, token_file: str | None,
                      ca_cert: str | None, tls_server_name: str | None, context: str | None,
                      config_file: str | None, environ: Mapping[str, str] | None,
                      connection: Connection | None) -> Connection:
    """The Connection a client's arguments name (``connection`` itself when
    given), with the plaintext-token warning given once."""
    if connection is None:
        connection = resolve_connection(
            controller, token=token, token_file=token_file, ca_cert=ca_cert,
            tls_server_name=tls_server_name, context=context, config_file=config_file,
            env=environ)
    warn_plaintext_token(connection)
    return connection


def warn_plaintext_token(conn: Connection) -> None:
    """Warns, as tallyctl does, when the token would cross the network in
    plaintext (no TLS roots and an address that is not loopback)."""
    if conn.token and not conn.ca_cert_pem:
        for address in conn.addresses:
            if not is_loopback(address):
                warnings.warn(
                    "tally: the token goes to %s without TLS, readable by anyone on the path; "
                    "set ca_cert (or TALLY_CA_CERT, or the context's ca_cert)" % address,
                    stacklevel=3)
                return


def channel_options(conn: Connection) -> list[tuple[str, Any]]:
    """gRPC channel arguments: the certificate name to check, when set."""
    options: list[tuple[str, Any]] = []
    if conn.tls_server_name:
        options.append(("grpc.ssl_target_name_override", conn.tls_server_name))
    return options


def metadata(conn: Connection) -> tuple[tuple[str, str], ...]:
    """The call's metadata: the bearer token, when there is one."""
    return (("authorization", "Bearer " + conn.token),) if conn.token else ()


def backoff(attempt: int, base: float = 0.3, cap: float = 5.0) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): doubling, capped."""
    return float(min(cap, base * (2 ** attempt)))
