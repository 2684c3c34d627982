"""The asyncio client: ``tally.aio.Client`` has the synchronous client's
constructor, ``from_config`` and methods, as coroutines (``list`` and
``watch`` are async iterators), with the same failover, retries and watch
resumption."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

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

JobRef = _common.JobRef
ExperimentRef = _common.ExperimentRef


class Client:
    """An asyncio client; see tally.Client for the arguments. Use it as
    ``async with tally.aio.Client.from_config() as client:``."""

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
        self._channels: list[tuple[str, grpc.aio.Channel]] = []
        for address in connection.addresses:
            if connection.ca_cert_pem:
                creds = grpc.ssl_channel_credentials(root_certificates=connection.ca_cert_pem)
                ch = grpc.aio.secure_channel(address, creds, _common.channel_options(connection))
            else:
                ch = grpc.aio.insecure_channel(address)
            self._channels.append((address, ch))
        self._current = 0
        self._metadata = _common.metadata(connection)
        self.jobs = Jobs(self)
        """The Jobs API."""
        self.experiments = Experiments(self)
        """The Experiments API."""

    @classmethod
    def from_config(cls, context: str | None = None, *, config_file: str | None = None,
                    **kwargs: Any) -> Client:
        """As tally.Client.from_config."""
        return cls(context=context, config_file=config_file, **kwargs)

    @property
    def connection(self) -> Connection:
        """The resolved connection."""
        return self._conn

    @property
    def address(self) -> str:
        """The address calls go to now."""
        return self._channels[self._current][0]

    async def close(self) -> None:
        """Closes every channel."""
        for _, ch in self._channels:
            await ch.close(None)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _error(self, e: grpc.aio.AioRpcError | _common.ConnectFailure,
               address: str) -> TallyError:
        details = e.details()
        if len(self._channels) > 1 and e.code() == grpc.StatusCode.UNAVAILABLE:
            details = "no tallyd of %s answered (each was tried); the last said: %s" % (
                self._conn.address, details)
        return error_from_rpc(e.code(), details, address, self._conn.token,
                              tls=bool(self._conn.ca_cert_pem))

    async def _unary(self, method: str, request: Any) -> Any:
        path, req_cls, resp_cls = _common.METHODS[method]
        last: grpc.aio.AioRpcError | None = None
        address = self.address
        for attempt in range(self._retries):
            for _ in range(len(self._channels)):
                address, ch = self._channels[self._current]
                call = ch.unary_unary(path, request_serializer=req_cls.SerializeToString,
                                      response_deserializer=resp_cls.FromString)
                try:
                    return await call(request, timeout=self._timeout, metadata=self._metadata)
                except grpc.aio.AioRpcError as e:
                    if e.code() not in _common.RETRYABLE:
                        raise self._error(e, address) from None
                    last = e
                    self._current = (self._current + 1) % len(self._channels)
            if attempt + 1 < self._retries:
                await asyncio.sleep(_common.backoff(attempt))
        assert last is not None
        raise self._error(last, address) from None

    async def _watch(self, method: str, make_request: Callable[[int], Any],
                     after: int, limit: int = 20,
                     deadline: float | None = None) -> AsyncIterator[Any]:
        """As tally.Client's: the connect timeout bounds the watch until
        tallyd has taken it once; ``deadline`` (time.monotonic()) the whole
        watch."""
        path, req_cls, resp_cls = _common.METHODS[method]
        failures = 0
        wait = 0.2
        established = False
        connect_deadline = time.monotonic() + self._timeout
        while True:
            address, ch = self._channels[self._current]
            call = ch.unary_stream(path, request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            stream = call(make_request(after), metadata=self._metadata, timeout=timeout)
            try:
                if not established:
                    try:
                        metadata = await asyncio.wait_for(
                            stream.initial_metadata(),
                            max(0.0, connect_deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        raise self._error(_common.connect_failure(self._timeout, None),
                                          address) from None
                    if metadata is not None and _common.WATCH_ESTABLISHED_KEY in metadata:
                        established = True
                async for event in stream:
                    established = True
                    failures, wait = 0, 0.2
                    if event.sequence <= after:
                        continue
                    after = event.sequence
                    yield event
                return
            except grpc.aio.AioRpcError as e:
                if not established and e.code() in _common.STREAM_RETRYABLE \
                        and time.monotonic() + wait > connect_deadline:
                    raise self._error(_common.connect_failure(self._timeout, e.details()),
                                      address) from None
                failures += 1
                if e.code() not in _common.STREAM_RETRYABLE or (established and failures > limit):
                    raise self._error(e, address) from None
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    self._current = (self._current + 1) % len(self._channels)
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)
            finally:
                stream.cancel()

    async def _pages(self, method: str, make_request: Callable[[str], Any],
                     items: Callable[[Any], Iterable[Any]]) -> AsyncIterator[Any]:
        token = ""
        while True:
            resp = await self._unary(method, make_request(token))
            for item in items(resp):
                yield item
            token = resp.next_page_token
            if not token:
                return

    async def submit(self, spec: JobSpecInput, request_id: str | None = None) -> jobs_pb2.Job:
        """Same as ``jobs.submit``."""
        return await self.jobs.submit(spec, request_id)

    async def get(self, job: JobRef) -> jobs_pb2.Job:
        """Same as ``jobs.get``."""
        return await self.jobs.get(job)

    def list(self, states: Iterable[str | int] | None = None, tenant: str = "",
             page_size: int = 100, *, labels: Mapping[str, str] | None = None,
             name_prefix: str = "", created_after: _common.TimeBound = None,
             created_before: _common.TimeBound = None) -> AsyncIterator[jobs_pb2.Job]:
        """Same as ``jobs.list``."""
        return self.jobs.list(states, tenant, page_size, labels=labels, name_prefix=name_prefix,
                              created_after=created_after, created_before=created_before)

    async def cancel(self, job: JobRef, reason: str = "") -> jobs_pb2.Job:
        """Same as ``jobs.cancel``."""
        return await self.jobs.cancel(job, reason)

    def watch(self, job: JobRef, after: int = 0) -> AsyncIterator[jobs_pb2.JobEvent]:
        """Same as ``jobs.watch``."""
        return self.jobs.watch(job, after)

    def logs(self, job: JobRef, follow: bool = False, *, attempt: int = 0,
             rank: int | None = None, since: _logs.Since = None, tail: int = 0,
             after: int = 0) -> AsyncIterator[_logs.LogLine]:
        """Same as ``jobs.logs``."""
        return self.jobs.logs(job, follow, attempt=attempt, rank=rank, since=since, tail=tail,
                              after=after)

    async def checkpoints(self, job: JobRef) -> builtins.list[jobs_pb2.Checkpoint]:
        """Same as ``jobs.checkpoints``."""
        return await self.jobs.checkpoints(job)

    async def estimate(self, spec: JobSpecInput) -> jobs_pb2.CostEstimate:
        """Same as ``jobs.estimate``."""
        return await self.jobs.estimate(spec)

    async def validate(self, spec: JobSpecInput) -> spec_pb2.JobSpec:
        """Same as ``jobs.validate``."""
        return await self.jobs.validate(spec)

    async def eval_history(self, job: JobRef) -> EvalHistory:
        """Same as ``jobs.eval_history``."""
        return await self.jobs.eval_history(job)

    async def train_history(self, job: JobRef) -> TrainHistory:
        """Same as ``jobs.train_history``."""
        return await self.jobs.train_history(job)


class Jobs:
    """The Jobs API as coroutines; see tally.Jobs."""

    def __init__(self, client: Client) -> None:
        self._c = client

    async def submit(self, spec: JobSpecInput, request_id: str | None = None) -> jobs_pb2.Job:
        """Submits a job; retries reuse one request id (see tally.Jobs.submit)."""
        req = jobs_pb2.SubmitJobRequest(spec=load_job_spec(spec),
                                        request_id=request_id or _common.new_request_id())
        out: jobs_pb2.Job = await self._c._unary("SubmitJob", req)
        return out

    async def get(self, job: JobRef) -> jobs_pb2.Job:
        """The job as of now."""
        out: jobs_pb2.Job = await self._c._unary(
            "GetJob", jobs_pb2.GetJobRequest(name=_common.job_name(job)))
        return out

    def list(self, states: Iterable[str | int] | None = None, tenant: str = "",
             page_size: int = 100, *, labels: Mapping[str, str] | None = None,
             name_prefix: str = "", created_after: _common.TimeBound = None,
             created_before: _common.TimeBound = None) -> AsyncIterator[jobs_pb2.Job]:
        """Every job the caller may see, over all pages, filtered by tallyd
        (see tally.Jobs.list)."""
        base = _common.list_jobs_request(states, tenant, page_size, labels, name_prefix,
                                         created_after, created_before)

        def request(token: str) -> jobs_pb2.ListJobsRequest:
            req = jobs_pb2.ListJobsRequest()
            req.CopyFrom(base)
            req.page_token = token
            return req

        return self._c._pages("ListJobs", request, lambda r: r.jobs)

    async def cancel(self, job: JobRef, reason: str = "") -> jobs_pb2.Job:
        """Cancels a queued or running job."""
        out: jobs_pb2.Job = await self._c._unary(
            "CancelJob", jobs_pb2.CancelJobRequest(name=_common.job_name(job), reason=reason))
        return out

    def logs(self, job: JobRef, follow: bool = False, *, attempt: int = 0,
             rank: int | None = None, since: _logs.Since = None, tail: int = 0,
             after: int = 0) -> AsyncIterator[_logs.LogLine]:
        """What the job's attempts printed; as tally.Jobs.logs (an async
        iterator)."""
        sel = _logs.selector(attempt, rank, since, tail, after)
        return _logs.async_logs(self._c, job, follow, sel)

    def watch(self, job: JobRef, after: int = 0) -> AsyncIterator[jobs_pb2.JobEvent]:
        """The job's events after ``after``, resumed after a dropped stream."""
        name = _common.job_name(job)
        return self._c._watch(
            "WatchJob", lambda a: jobs_pb2.WatchJobRequest(name=name, after_sequence=a), after)

    async def wait(self, job: JobRef, timeout: float | None = None,
                   progress: bool = True) -> jobs_pb2.Job:
        """Watches the job to its end and returns it as it ended; as
        tally.Jobs.wait (``timeout`` in seconds: DeadlineExceeded;
        ``progress``: a tqdm bar when tqdm is installed)."""
        name = _common.job_name(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        current = await self.get(name)
        if current.state in _common.TERMINAL_JOB_STATES:
            return current
        bar = JobProgress(current, progress)
        try:
            async for event in self._c._watch(
                    "WatchJob",
                    lambda a: jobs_pb2.WatchJobRequest(name=name, after_sequence=a),
                    current.last_event_sequence, deadline=deadline):
                bar.event(event)
        except DeadlineExceeded as e:
            if timeout is None:
                raise
            now = await self.get(name)
            raise wait_timed_out(name, timeout, state_name(now), " at step %d" % now.step,
                                 e) from None
        finally:
            bar.close()
        return await self.get(name)

    async def checkpoints(self, job: JobRef) -> builtins.list[jobs_pb2.Checkpoint]:
        """The job's checkpoints."""
        resp: jobs_pb2.ListCheckpointsResponse = await self._c._unary(
            "ListCheckpoints", jobs_pb2.ListCheckpointsRequest(name=_common.job_name(job)))
        return list(resp.checkpoints)

    async def estimate(self, spec: JobSpecInput) -> jobs_pb2.CostEstimate:
        """What the spec would cost."""
        out: jobs_pb2.CostEstimate = await self._c._unary(
            "EstimateCost", jobs_pb2.EstimateCostRequest(spec=load_job_spec(spec)))
        return out

    async def validate(self, spec: JobSpecInput) -> spec_pb2.JobSpec:
        """tallyd's validation of the spec, submitting nothing."""
        s = load_job_spec(spec)
        await self._c._unary("EstimateCost", jobs_pb2.EstimateCostRequest(spec=s))
        return s

    async def eval_history(self, job: JobRef) -> EvalHistory:
        """The job's evaluations."""
        j = await self.get(job)
        return EvalHistory(job=j.name, points=list(j.curve))

    async def train_history(self, job: JobRef) -> TrainHistory:
        """The job's training loss at every reported step (see
        tally.Jobs.train_history)."""
        j = await self.get(job)
        return TrainHistory(job=j.name, points=list(j.train_curve), every=j.train_curve_every)


class Experiments:
    """The Experiments API as coroutines; see tally.Experiments."""

    def __init__(self, client: Client) -> None:
        self._c = client

    async def create(self, spec: ExperimentSpecInput,
                     request_id: str | None = None) -> experiments_pb2.Experiment:
        """Creates an experiment; retries reuse one request id."""
        req = experiments_pb2.CreateExperimentRequest(
            spec=load_experiment_spec(spec), request_id=request_id or _common.new_request_id())
        out: experiments_pb2.Experiment = await self._c._unary("CreateExperiment", req)
        return out

    async def get(self, experiment: ExperimentRef) -> experiments_pb2.Experiment:
        """The experiment as of now."""
        out: experiments_pb2.Experiment = await self._c._unary(
            "GetExperiment",
            experiments_pb2.GetExperimentRequest(name=_common.experiment_name(experiment)))
        return out

    def list(self, tenant: str = "",
             page_size: int = 100) -> AsyncIterator[experiments_pb2.Experiment]:
        """Every experiment the caller may see, over all pages."""
        return self._c._pages(
            "ListExperiments", lambda t: experiments_pb2.ListExperimentsRequest(
                page_size=page_size, page_token=t, tenant=tenant),
            lambda r: r.experiments)

    async def cancel(self, experiment: ExperimentRef,
                     reason: str = "") -> experiments_pb2.Experiment:
        """Cancels the experiment and its running variants."""
        out: experiments_pb2.Experiment = await self._c._unary(
            "CancelExperiment", experiments_pb2.CancelExperimentRequest(
                name=_common.experiment_name(experiment), reason=reason))
        return out

    def watch(self, experiment: ExperimentRef,
              after: int = 0) -> AsyncIterator[experiments_pb2.ExperimentEvent]:
        """The experiment's events after ``after``, resumed after a drop."""
        name = _common.experiment_name(experiment)
        return self._c._watch(
            "WatchExperiment",
            lambda a: experiments_pb2.WatchExperimentRequest(name=name, after_sequence=a), after)

    async def wait(self, experiment: ExperimentRef, timeout: float | None = None,
                   progress: bool = True) -> experiments_pb2.Experiment:
        """Watches the experiment to its end and returns it as it ended; as
        tally.Experiments.wait."""
        name = _common.experiment_name(experiment)
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = ExperimentProgress(await self.get(name), progress)
        try:
            async for event in self._c._watch(
                    "WatchExperiment",
                    lambda a: experiments_pb2.WatchExperimentRequest(name=name, after_sequence=a),
                    0, deadline=deadline):
                bar.event(event)
        except DeadlineExceeded as e:
            if timeout is None:
                raise
            raise wait_timed_out(name, timeout, state_name(await self.get(name)), "",
                                 e) from None
        finally:
            bar.close()
        return await self.get(name)

    async def report(self, experiment: ExperimentRef) -> ExperimentReport:
        """The variant table and every variant's evaluation curve."""
        e = await self.get(experiment)
        curves = {}
        for v in e.variants:
            if v.job:
                curves[run_name(v)] = list((await self._c.jobs.get(v.job)).curve)
        return ExperimentReport(experiment=e, curves=curves)
