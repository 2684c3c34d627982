"""Watches and waits against endpoints that do not answer and a small fake
tallyd (an in-process gRPC server): the first connection of a watch is
bounded by the client's timeout, naming the address; wait() gives up after
its timeout saying where the job stands, and shows a progress bar. Both
clients."""

import asyncio
import contextlib
import io
import socket
import threading
import time
import unittest
from concurrent import futures

import grpc

import tally
import tally.aio
from tally.v1 import jobs_pb2, jobs_pb2_grpc


class HungEndpoint:
    """A TCP port that accepts connections and never says anything."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


class FakeJobs(jobs_pb2_grpc.JobsServicer):
    """jobs/7, RUNNING at step 5 of 100, whose watch never ends."""

    def __init__(self):
        self.stop = threading.Event()

    def job(self):
        job = jobs_pb2.Job(name="jobs/7", state=jobs_pb2.JOB_STATE_RUNNING, step=5,
                           last_event_sequence=1)
        job.spec.training.max_steps = 100
        return job

    def GetJob(self, request, context):
        return self.job()

    def WatchJob(self, request, context):
        context.send_initial_metadata(((tally._common.WATCH_ESTABLISHED_KEY, "1"),))
        yield jobs_pb2.JobEvent(job="jobs/7", sequence=2, type="progress", step=5,
                                train_loss=3.25, cost_usd=0.5,
                                state=jobs_pb2.JOB_STATE_RUNNING)
        while context.is_active() and not self.stop.wait(0.05):
            pass


class WatchConnectTest(unittest.TestCase):
    def test_a_hung_endpoint_fails_within_the_timeout_naming_the_address(self):
        hung = HungEndpoint()
        self.addCleanup(hung.close)
        client = tally.Client(hung.address, environ={}, timeout=1.5)
        self.addCleanup(client.close)
        start = time.monotonic()
        with self.assertRaises(tally.Unavailable) as cm:
            next(iter(client.watch(1)))
        self.assertLess(time.monotonic() - start, 6)
        self.assertIn(hung.address, str(cm.exception))
        self.assertIn("the watch got no answer within 1.5s", str(cm.exception))

    def test_a_refused_endpoint_fails_within_the_timeout(self):
        client = tally.Client("127.0.0.1:1", environ={}, timeout=1.5)
        self.addCleanup(client.close)
        start = time.monotonic()
        with self.assertRaises(tally.Unavailable) as cm:
            list(client.watch(1))
        self.assertLess(time.monotonic() - start, 6)
        self.assertIn("127.0.0.1:1", str(cm.exception))

    def test_the_asyncio_client_too(self):
        hung = HungEndpoint()
        self.addCleanup(hung.close)

        async def watch(address):
            async with tally.aio.Client(address, environ={}, timeout=1.5) as c:
                return [e async for e in c.watch(1)]

        for address in (hung.address, "127.0.0.1:1"):
            start = time.monotonic()
            with self.assertRaises(tally.Unavailable) as cm:
                asyncio.run(watch(address))
            self.assertLess(time.monotonic() - start, 6)
            self.assertIn(address, str(cm.exception))


class WaitTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeJobs()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        jobs_pb2_grpc.add_JobsServicer_to_server(self.fake, self.server)
        self.address = "127.0.0.1:%d" % self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def tearDown(self):
        self.fake.stop.set()
        self.server.stop(0)

    def test_wait_gives_up_after_its_timeout_saying_where_the_job_is(self):
        client = tally.Client(self.address, environ={}, timeout=5)
        self.addCleanup(client.close)
        start = time.monotonic()
        with self.assertRaises(tally.DeadlineExceeded) as cm:
            client.jobs.wait(7, timeout=1, progress=False)
        self.assertLess(time.monotonic() - start, 4)
        self.assertIn("jobs/7 has not ended within 1s: RUNNING at step 5", str(cm.exception))
        self.assertIsInstance(cm.exception, TimeoutError)

    def test_an_established_watch_outlives_the_connect_timeout(self):
        client = tally.Client(self.address, environ={}, timeout=0.5)
        self.addCleanup(client.close)
        with self.assertRaises(tally.DeadlineExceeded) as cm:
            client.jobs.wait("jobs/7", timeout=2, progress=False)
        self.assertIn("within 2s", str(cm.exception))  # not the 0.5 s connect timeout

    def test_progress_is_a_bar_of_steps_loss_and_dollars(self):
        client = tally.Client(self.address, environ={}, timeout=5)
        self.addCleanup(client.close)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(tally.DeadlineExceeded):
            client.jobs.wait(7, timeout=1)
        out = err.getvalue()
        self.assertIn("jobs/7", out)
        self.assertIn("5/100", out)
        self.assertIn("loss=3.2500", out)
        self.assertIn("$=0.5000", out)

    def test_the_asyncio_client_waits_too(self):
        async def wait():
            async with tally.aio.Client(self.address, environ={}, timeout=5) as c:
                return await c.jobs.wait(7, timeout=1, progress=False)

        with self.assertRaises(tally.DeadlineExceeded) as cm:
            asyncio.run(wait())
        self.assertIn("jobs/7 has not ended within 1s: RUNNING at step 5", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
