"""Job logs: what a job's attempts printed, as tallyd keeps it (the last
logs.keep_mib of each job; older output is replaced by one marker line).

``client.logs(job)`` pages through the lines kept; ``follow=True`` keeps
reading new ones until the job has ended (resumed after the last line seen
when the stream drops). Each line is a :class:`LogLine`; its ``text`` is the
worker's, untrusted: ``str(line)`` shows it with control characters escaped.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Union

from tally import _common
from tally.v1 import jobs_pb2

if TYPE_CHECKING:
    from tally import aio
    from tally._client import Client

Since = Union[datetime.datetime, datetime.timedelta, None]
"""Lines from this time on: a datetime (naive: local time) or a timedelta
before now."""

_PAGE = 1000


@dataclasses.dataclass(frozen=True)
class LogLine:
    """One line an attempt printed."""

    sequence: int
    """Per job, rising: resume after it (``after=``)."""
    time: datetime.datetime
    """When the worker captured it (UTC)."""
    attempt: int
    rank: int
    level: str
    """trace, debug, info, warning, error or critical."""
    source: str
    """trainer (the attempt's output), worker (the worker's messages about
    it) or tally (a marker for dropped output)."""
    text: str
    dropped_bytes: int = 0
    """A marker: bytes of older output dropped so far."""

    @classmethod
    def from_proto(cls, m: jobs_pb2.LogLine) -> LogLine:
        return cls(sequence=m.sequence,
                   time=m.time.ToDatetime(tzinfo=datetime.timezone.utc),
                   attempt=m.attempt, rank=m.rank, level=m.level, source=m.source,
                   text=m.text, dropped_bytes=m.dropped_bytes)

    def __str__(self) -> str:
        source = "" if self.source == "trainer" else "[%s] " % escape(self.source)
        return "%s a%d r%d %-7s %s%s" % (
            self.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], self.attempt, self.rank,
            escape(self.level), source, escape(self.text))


def escape(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1, line and
    paragraph separators, bidirectional controls) written as an escape, as
    tallyctl prints untrusted text."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o <= 0x9F or o in (0x2028, 0x2029) or 0x202A <= o <= 0x202E \
                or 0x2066 <= o <= 0x2069:
            out.append("\\u{%04X}" % o)
        else:
            out.append(ch)
    return "".join(out)


def selector(attempt: int = 0, rank: int | None = None, since: Since = None, tail: int = 0,
             after: int = 0) -> jobs_pb2.LogSelector:
    """The LogSelector of the logs() arguments; TypeError or ValueError
    naming the argument."""
    for name, value in (("attempt", attempt), ("tail", tail), ("after", after)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
        if value < 0:
            raise ValueError("%s: must not be negative, got %d" % (name, value))
    sel = jobs_pb2.LogSelector(attempt=attempt, tail=tail, after_sequence=after)
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError("rank: a rank (0 or more) or None for every rank, got %r" % (rank,))
        sel.rank = rank
    if since is not None:
        if isinstance(since, datetime.timedelta):
            at = datetime.datetime.now(datetime.timezone.utc) - since
        elif isinstance(since, datetime.datetime):
            at = since.astimezone(datetime.timezone.utc)
        else:
            raise TypeError("since: expected a datetime or a timedelta (that long ago), got %s"
                            % type(since).__name__)
        sel.since.FromDatetime(at)
    return sel


def _watch_request(name: str, sel: jobs_pb2.LogSelector,
                   start: int) -> Callable[[int], jobs_pb2.WatchJobLogsRequest]:
    def make(after: int) -> jobs_pb2.WatchJobLogsRequest:
        s = jobs_pb2.LogSelector()
        s.CopyFrom(sel)
        s.after_sequence = after
        if after != start:
            s.tail = 0  # resumed: the tail was read already
        return jobs_pb2.WatchJobLogsRequest(name=name, selector=s)
    return make


def sync_logs(client: Client, job: _common.JobRef, follow: bool,
              sel: jobs_pb2.LogSelector) -> Iterator[LogLine]:
    name = _common.job_name(job)
    if follow:
        for m in client._watch("WatchJobLogs",
                               _watch_request(name, sel, sel.after_sequence),
                               sel.after_sequence, limit=20):
            yield LogLine.from_proto(m)
        return
    while True:
        resp = client._unary("GetJobLogs", jobs_pb2.GetJobLogsRequest(
            name=name, selector=sel, page_size=_PAGE))
        for m in resp.lines:
            yield LogLine.from_proto(m)
        if not resp.more or not resp.lines:
            return
        sel.tail = 0
        sel.after_sequence = resp.lines[-1].sequence


async def async_logs(client: aio.Client, job: _common.JobRef, follow: bool,
                     sel: jobs_pb2.LogSelector) -> AsyncIterator[LogLine]:
    name = _common.job_name(job)
    if follow:
        async for m in client._watch("WatchJobLogs",
                                     _watch_request(name, sel, sel.after_sequence),
                                     sel.after_sequence, limit=20):
            yield LogLine.from_proto(m)
        return
    while True:
        resp = await client._unary("GetJobLogs", jobs_pb2.GetJobLogsRequest(
            name=name, selector=sel, page_size=_PAGE))
        for m in resp.lines:
            yield LogLine.from_proto(m)
        if not resp.more or not resp.lines:
            return
        sel.tail = 0
        sel.after_sequence = resp.lines[-1].sequence
