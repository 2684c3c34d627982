"""The synchronous client."""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import grpc

from tally import _common, _logs
from tally._config import Connection
from tally._display import state_name
from tally._errors import DeadlineExceeded, TallyError, error_from_rpc
from tally._progress import ExperimentProgress, JobProgress, wait_timed_out
from tally._report import EvalHistory, ExperimentReport, TrainHistory, run_name
from tally._spec import (ExperimentSpecInput, JobSpecInput, load_experiment_spec,
                         load_job_spec)
from tally.v1 import experiments_pb2, jobs_pb2, spec_pb2

__all__ = ["Client", "Jobs", "Experiments"]

R = TypeVar("R")
JobRef = _common.JobRef
ExperimentRef = _common.ExperimentRef


class _Endpoint:
    def __init__(self, address: str, conn: Connection) -> None:
        self.address = address
        if conn.ca_cert_pem:
            creds = grpc.ssl_channel_credentials(root_certificates=conn.ca_cert_pem)
            self.channel = grpc.secure_channel(address, creds, _common.channel_options(conn))
        else:
            self.channel = grpc.insecure_channel(address)


class Client:
    """A client of one tallyd (or of a leader and its standbys).

    ``Client(...)`` takes tallyctl's connection flags as keyword arguments
    (``controller``, ``token``, ``token_file``, ``ca_cert``,
    ``tls_server_name``, ``context``, ``config_file``) and resolves them with
    the environment (TALLY_CONTROLLER, TALLY_TOKEN, TALLY_CA_CERT,
    TALLY_CONTEXT, TALLY_CONFIG) and the contexts file
    (~/.config/tally/config.yaml) by tallyctl's rules. ``controller`` may
    list several addresses separated by commas: every call tries them in
    order while one answers UNAVAILABLE, and keeps to the one that answered.

    Args:
        timeout: Deadline of each unary call, in seconds.
        retries: How many times a unary call is sent in all while every
            address answers UNAVAILABLE, with doubling waits between.
        environ: The environment to read instead of os.environ.
        connection: An already resolved Connection (then the other
            connection arguments must not be given).

    Raises:
        ConfigError: A setting is wrong; the message names it.
    """

    def __init__(self, controller: str | None = None, *, token: str | None = None,
                 token_file: str | None = None, ca_cert: str | None = None,
                 tls_server_name: str | None = None, context: str | None = None,
                 config_file: str | None = None, timeout: float = 10.0, retries: int = 3,
                 environ: Mapping[str, str] | None = None,
                 connection: Connection | None = None) -> None:
        connection = _common.client_connection(
            controller, token=token, token_file=token_file, ca_cert=ca_cert,
            tls_server_name=tls_server_name, context=context, config_file=config_file,
            environ=environ, connection=connection)
        self._conn = connection
        self._timeout = timeout
        self._retries = max(1, retries)
        self._endpoints = [_Endpoint(a, connection) for a in connection.addresses]
        self._current = 0
        self._metadata = _common.metadata(connection)
        self.jobs = Jobs(self)
        """The Jobs API: submit, get, list, cancel, watch, checkpoints, estimate, validate."""
        self.experiments = Experiments(self)
        """The Experiments API: create, get, list, watch, cancel, report."""

    @classmethod
    def from_config(cls, context: str | None = None, *, config_file: str | None = None,
                    **kwargs: Any) -> Client:
        """A client for ``context`` of the contexts file (default:
        TALLY_CONTEXT, else the file's current_context), with the same
        environment overrides as tallyctl. Other keyword arguments are
        Client's."""
        return cls(context=context, config_file=config_file, **kwargs)

    @property
    def connection(self) -> Connection:
        """The resolved connection (addresses, TLS roots, token source,
        context, config file)."""
        return self._conn

    @property
    def address(self) -> str:
        """The address calls go to now (the last that answered)."""
        return self._endpoints[self._current].address

    def close(self) -> None:
        """Closes every channel."""
        for e in self._endpoints:
            e.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "tally.Client(%r)" % self._conn.address

    # --- calls

    def _error(self, e: grpc.RpcError, address: str) -> TallyError:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        if len(self._endpoints) > 1 and code == grpc.StatusCode.UNAVAILABLE:
            details = "no tallyd of %s answered (each was tried); the last said: %s" % (
                self._conn.address, details)
        return error_from_rpc(code, details, address, self._conn.token,
                              tls=bool(self._conn.ca_cert_pem))

    def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        path, req_cls, resp_cls = _common.METHODS[method]
        last: grpc.RpcError | None = None
        address = self.address
        for attempt in range(self._retries):
            for _ in range(len(self._endpoints)):
                endpoint = self._endpoints[self._current]
                address = endpoint.address
                call = endpoint.channel.unary_unary(
                    path, request_serializer=req_cls.SerializeToString,
                    response_deserializer=resp_cls.FromString)
                try:
                    return call(request, timeout=timeout or self._timeout,
                                metadata=self._metadata)
                except grpc.RpcError as e:
                    if e.code() not in _common.RETRYABLE:
                        raise self._error(e, address) from None
                    last = e
                    self._current = (self._current + 1) % len(self._endpoints)
            if attempt + 1 < self._retries:
                time.sleep(_common.backoff(attempt))
        assert last is not None
        raise self._error(last, address) from None

    def _watch(self, method: str, make_request: Callable[[int], Any], after: int,
               limit: int, deadline: float | None = None) -> Iterator[Any]:
        """Events after ``after``, resuming after the last one seen whenever
        the stream drops, on the next address when there are several.

        Until tallyd has accepted the watch once (its initial metadata), the
        client's timeout bounds the whole try, a hung endpoint included:
        Unavailable naming the address. ``deadline`` (time.monotonic())
        bounds the whole watch: DeadlineExceeded."""
        path, req_cls, resp_cls = _common.METHODS[method]
        failures = 0
        wait = 0.2
        established = False
        connect_deadline = time.monotonic() + self._timeout
        while True:
            endpoint = self._endpoints[self._current]
            call = endpoint.channel.unary_stream(
                path, request_serializer=req_cls.SerializeToString,
                response_deserializer=resp_cls.FromString)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            stream = call(make_request(after), metadata=self._metadata, timeout=timeout)
            timer: threading.Timer | None = None
            connect_timed_out = threading.Event()
            if not established:
                def give_up(s: Any = stream) -> None:
                    connect_timed_out.set()
                    s.cancel()
                timer = threading.Timer(max(0.0, connect_deadline - time.monotonic()), give_up)
                timer.daemon = True
                timer.start()
            try:
                if not established:
                    # tallyd sends this at once when it takes the watch; a
                    # failed call has none (its error is raised below).
                    metadata = stream.initial_metadata() or ()
                    if any(k == _common.WATCH_ESTABLISHED_KEY for k, _ in metadata):
                        established = True
                        if timer is not None:
                            timer.cancel()
                for event in stream:
                    if not established:
                        established = True
                        if timer is not None:
                            timer.cancel()
                    failures, wait = 0, 0.2
                    if event.sequence <= after:
                        continue  # already seen before the stream dropped
                    after = event.sequence
                    yield event
                return
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                if connect_timed_out.is_set() or (
                        not established and code in _common.STREAM_RETRYABLE
                        and time.monotonic() + wait > connect_deadline):
                    details = "" if connect_timed_out.is_set() or not hasattr(e, "details") \
                        else e.details()
                    raise self._error(_common.connect_failure(self._timeout, details),
                                      endpoint.address) from None
                failures += 1
                if code not in _common.STREAM_RETRYABLE or (established and failures > limit):
                    raise self._error(e, endpoint.address) from None
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._current = (self._current + 1) % len(self._endpoints)
                time.sleep(wait)
                wait = min(wait * 2, 5.0)
            finally:
                if timer is not None:
                    timer.cancel()
                stream.cancel()  # type: ignore[no-untyped-call]

    def _pages(self, method: str, make_request: Callable[[str], Any],
               items: Callable[[Any], Iterable[R]]) -> Iterator[R]:
        token = ""
        while True:
            resp = self._unary(method, make_request(token))
            yield from items(resp)
            token = resp.next_page_token
            if not token:
                return

    # --- the Jobs API, also as the client's own methods

    def submit(self, spec: JobSpecInput, request_id: str | None = None) -> jobs_pb2.Job:
        """Same as ``jobs.submit``."""
        return self.jobs.submit(spec, request_id)

    def get(self, job: JobRef) -> jobs_pb2.Job:
        """Same as ``jobs.get``."""
        return self.jobs.get(job)

    def list(self, states: Iterable[str | int] | None = None, tenant: str = "",
             page_size: int = 100, *, labels: Mapping[str, str] | None = None,
             name_prefix: str = "", created_after: _common.TimeBound = None,
             created_before: _common.TimeBound = None) -> Iterator[jobs_pb2.Job]:
        """Same as ``jobs.list``."""
        return self.jobs.list(states, tenant, page_size, labels=labels, name_prefix=name_prefix,
                              created_after=created_after, created_before=created_before)

    def cancel(self, job: JobRef, reason: str = "") -> jobs_pb2.Job:
        """Same as ``jobs.cancel``."""
        return self.jobs.cancel(job, reason)

    def watch(self, job: JobRef, after: int = 0) -> Iterator[jobs_pb2.JobEvent]:
        """Same as ``jobs.watch``."""
        return self.jobs.watch(job, after)

    def logs(self, job: JobRef, follow: bool = False, *, attempt: int = 0,
             rank: int | None = None, since: _logs.Since = None, tail: int = 0,
             after: int = 0) -> Iterator[_logs.LogLine]:
        """Same as ``jobs.logs``."""
        return self.jobs.logs(job, follow, attempt=attempt, rank=rank, since=since, tail=tail,
                              after=after)

    def checkpoints(self, job: JobRef) -> builtins.list[jobs_pb2.Checkpoint]:
        """Same as ``jobs.checkpoints``."""
        return self.jobs.checkpoints(job)

    def estimate(self, spec: JobSpecInput) -> jobs_pb2.CostEstimate:
        """Same as ``jobs.estimate``."""
        return self.jobs.estimate(spec)

    def validate(self, spec: JobSpecInput) -> spec_pb2.JobSpec:
        """Same as ``jobs.validate``."""
        return self.jobs.validate(spec)

    def eval_history(self, job: JobRef) -> EvalHistory:
        """Same as ``jobs.eval_history``."""
        return self.jobs.eval_history(job)

    def train_history(self, job: JobRef) -> TrainHistory:
        """Same as ``jobs.train_history``."""
        return self.jobs.train_history(job)


class Jobs:
    """tallyd's Jobs API. Results are the API's own protobuf messages
    (tally.v1.Job, JobEvent, Checkpoint, CostEstimate)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def submit(self, spec: JobSpecInput, request_id: str | None = None) -> jobs_pb2.Job:
        """Submits a job and returns it (QUEUED).

        Args:
            spec: A tally.v1.JobSpec, a dict of its fields, or the path of a
                YAML/JSON spec file (tallyctl submit -f's format).
            request_id: The idempotency key; default a fresh one. Every retry
                of this call sends the same key, so a submit whose answer was
                lost never makes two jobs.

        Raises:
            InvalidSpec: The spec was refused; ``field`` names the field.
        """
        req = jobs_pb2.SubmitJobRequest(spec=load_job_spec(spec),
                                        request_id=request_id or _common.new_request_id())
        job: jobs_pb2.Job = self._c._unary("SubmitJob", req)
        return job

    def get(self, job: JobRef) -> jobs_pb2.Job:
        """The job as of now. Raises NotFound (also for another tenant's)."""
        out: jobs_pb2.Job = self._c._unary("GetJob",
                                           jobs_pb2.GetJobRequest(name=_common.job_name(job)))
        return out

    def list(self, states: Iterable[str | int] | None = None, tenant: str = "",
             page_size: int = 100, *, labels: Mapping[str, str] | None = None,
             name_prefix: str = "", created_after: _common.TimeBound = None,
             created_before: _common.TimeBound = None) -> Iterator[jobs_pb2.Job]:
        """Every job the caller may see, newest first, fetching page after
        page as the iterator is read. tallyd applies every filter.

        Args:
            states: Only jobs in these states ("queued", "running", ... or
                JobState values); default all.
            tenant: Admins: only this tenant's jobs.
            page_size: Jobs per call (1 to 1000).
            labels: Only jobs whose spec.labels hold all of these.
            name_prefix: Only jobs whose display name starts with this.
            created_after: Only jobs created at or after this datetime, or
                within this timedelta of now.
            created_before: Only jobs created before this (datetime, or a
                timedelta ago).
        """
        base = _common.list_jobs_request(states, tenant, page_size, labels, name_prefix,
                                         created_after, created_before)

        def request(token: str) -> jobs_pb2.ListJobsRequest:
            req = jobs_pb2.ListJobsRequest()
            req.CopyFrom(base)
            req.page_token = token
            return req

        return self._c._pages("ListJobs", request, lambda r: r.jobs)

    def cancel(self, job: JobRef, reason: str = "") -> jobs_pb2.Job:
        """Cancels a queued or running job; FailedPrecondition once it has
        ended."""
        out: jobs_pb2.Job = self._c._unary(
            "CancelJob", jobs_pb2.CancelJobRequest(name=_common.job_name(job), reason=reason))
        return out

    def logs(self, job: JobRef, follow: bool = False, *, attempt: int = 0,
             rank: int | None = None, since: _logs.Since = None, tail: int = 0,
             after: int = 0) -> Iterator[_logs.LogLine]:
        """What the job's attempts printed, oldest first, as LogLine objects
        (``str(line)`` escapes control characters). Only ``attempt``'s
        lines (0: all), ``rank``'s (None: all), those since a datetime or a
        timedelta ago, the last ``tail``, those after sequence ``after``.
        ``follow``: then every new line until the job has ended, resumed
        after the last line seen when the stream drops."""
        sel = _logs.selector(attempt, rank, since, tail, after)
        return _logs.sync_logs(self._c, job, follow, sel)

    def watch(self, job: JobRef, after: int = 0) -> Iterator[jobs_pb2.JobEvent]:
        """The job's events after sequence ``after``, as they happen, until
        the job has ended and its last event was read. A dropped stream
        (tallyd restarting, a failover) is resumed after the last event
        seen, without gaps or repeats; Unavailable once about a minute and a
        half of reconnecting has not brought it back."""
        name = _common.job_name(job)
        return self._c._watch(
            "WatchJob", lambda a: jobs_pb2.WatchJobRequest(name=name, after_sequence=a),
            after, limit=20)

    def wait(self, job: JobRef, timeout: float | None = None,
             progress: bool = True) -> jobs_pb2.Job:
        """Watches the job to its end and returns it as it ended.

        Args:
            timeout: Seconds to wait at most; None: until it ends.
            progress: Show a tqdm bar (steps, loss, dollars) while waiting,
                when tqdm is installed.

        Raises:
            DeadlineExceeded: The job had not ended within ``timeout``; the
                message says its state and step.
        """
        name = _common.job_name(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        current = self.get(name)
        if current.state in _common.TERMINAL_JOB_STATES:
            return current
        bar = JobProgress(current, progress)
        try:
            for event in self._c._watch(
                    "WatchJob",
                    lambda a: jobs_pb2.WatchJobRequest(name=name, after_sequence=a),
                    current.last_event_sequence, limit=20, deadline=deadline):
                bar.event(event)
        except DeadlineExceeded as e:
            if timeout is None:
                raise
            now = self.get(name)
            raise wait_timed_out(name, timeout, state_name(now), " at step %d" % now.step,
                                 e) from None
        finally:
            bar.close()
        return self.get(name)

    def checkpoints(self, job: JobRef) -> builtins.list[jobs_pb2.Checkpoint]:
        """The job's checkpoints with their cost, oldest first."""
        resp: jobs_pb2.ListCheckpointsResponse = self._c._unary(
            "ListCheckpoints", jobs_pb2.ListCheckpointsRequest(name=_common.job_name(job)))
        return list(resp.checkpoints)

    def estimate(self, spec: JobSpecInput) -> jobs_pb2.CostEstimate:
        """What the spec would cost (tallyd's estimate, also on spot)."""
        out: jobs_pb2.CostEstimate = self._c._unary(
            "EstimateCost", jobs_pb2.EstimateCostRequest(spec=load_job_spec(spec)))
        return out

    def validate(self, spec: JobSpecInput) -> spec_pb2.JobSpec:
        """Checks the spec with tallyd's own validation, submitting nothing,
        and returns it as read. Raises InvalidSpec naming the field."""
        s = load_job_spec(spec)
        self._c._unary("EstimateCost", jobs_pb2.EstimateCostRequest(spec=s))
        return s

    def eval_history(self, job: JobRef) -> EvalHistory:
        """The job's evaluations with what it had spent at each; with the
        ``pandas`` extra, ``.to_dataframe()``."""
        j = job if isinstance(job, jobs_pb2.Job) and job.curve else self.get(job)
        return EvalHistory(job=j.name, points=list(j.curve))

    def train_history(self, job: JobRef) -> TrainHistory:
        """The job's training loss at every reported step (tallyd's curve,
        not progress events; see TrainHistory); with the ``pandas`` extra,
        ``.to_dataframe()``."""
        j = self.get(job)
        return TrainHistory(job=j.name, points=list(j.train_curve), every=j.train_curve_every)


class Experiments:
    """tallyd's Experiments API. Results are the API's protobuf messages
    (tally.v1.Experiment, ExperimentEvent), and ExperimentReport."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, spec: ExperimentSpecInput,
               request_id: str | None = None) -> experiments_pb2.Experiment:
        """Creates an experiment (its variants are submitted at once).

        Args:
            spec: A tally.v1.ExperimentSpec, a dict, or the path of an
                experiment file (tallyctl experiment create -f's format).
            request_id: The idempotency key, reused on retries; default fresh.
        """
        req = experiments_pb2.CreateExperimentRequest(
            spec=load_experiment_spec(spec), request_id=request_id or _common.new_request_id())
        out: experiments_pb2.Experiment = self._c._unary("CreateExperiment", req)
        return out

    def get(self, experiment: ExperimentRef) -> experiments_pb2.Experiment:
        """The experiment with its variants' figures as of now."""
        out: experiments_pb2.Experiment = self._c._unary(
            "GetExperiment",
            experiments_pb2.GetExperimentRequest(name=_common.experiment_name(experiment)))
        return out

    def list(self, tenant: str = "", page_size: int = 100) -> Iterator[experiments_pb2.Experiment]:
        """Every experiment the caller may see, newest first, over all pages."""
        def request(token: str) -> experiments_pb2.ListExperimentsRequest:
            return experiments_pb2.ListExperimentsRequest(page_size=page_size, page_token=token,
                                                          tenant=tenant)

        return self._c._pages("ListExperiments", request, lambda r: r.experiments)

    def cancel(self, experiment: ExperimentRef, reason: str = "") -> experiments_pb2.Experiment:
        """Cancels the experiment and its variants still queued or running."""
        out: experiments_pb2.Experiment = self._c._unary(
            "CancelExperiment", experiments_pb2.CancelExperimentRequest(
                name=_common.experiment_name(experiment), reason=reason))
        return out

    def watch(self, experiment: ExperimentRef,
              after: int = 0) -> Iterator[experiments_pb2.ExperimentEvent]:
        """The experiment's events after ``after`` until it has ended,
        resumed without gaps or repeats after a dropped stream."""
        name = _common.experiment_name(experiment)
        return self._c._watch(
            "WatchExperiment",
            lambda a: experiments_pb2.WatchExperimentRequest(name=name, after_sequence=a),
            after, limit=20)

    def wait(self, experiment: ExperimentRef, timeout: float | None = None,
             progress: bool = True) -> experiments_pb2.Experiment:
        """Watches the experiment to its end and returns it as it ended.

        Args:
            timeout: Seconds to wait at most; None: until it ends.
            progress: Show a tqdm bar of the variants that have ended, when
                tqdm is installed.

        Raises:
            DeadlineExceeded: It had not ended within ``timeout``.
        """
        name = _common.experiment_name(experiment)
        deadline = None if timeout is None else time.monotonic() + timeout
        current = self.get(name)
        bar = ExperimentProgress(current, progress)
        try:
            for event in self._c._watch(
                    "WatchExperiment",
                    lambda a: experiments_pb2.WatchExperimentRequest(name=name, after_sequence=a),
                    0, limit=20, deadline=deadline):
                bar.event(event)
        except DeadlineExceeded as e:
            if timeout is None:
                raise
            raise wait_timed_out(name, timeout, state_name(self.get(name)), "", e) from None
        finally:
            bar.close()
        return self.get(name)

    def report(self, experiment: ExperimentRef) -> ExperimentReport:
        """The variant table and every variant's evaluation curve (what
        ``tallyctl experiment report`` prints and draws)."""
        e = self.get(experiment)
        curves = {}
        for v in e.variants:
            if v.job:
                curves[run_name(v)] = list(self._c.jobs.get(v.job).curve)
        return ExperimentReport(experiment=e, curves=curves)
