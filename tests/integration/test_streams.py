"""tallyd's streams: a rejected Hello leaves the live worker's stream alone,
the per-caller WatchJob limit, and watchers that see every event in order
while a worker produces them."""

import queue
import subprocess
import tempfile
import threading
import time
import unittest

import grpc
from harness import TALLYD, ClusterTest, Tallyd, jobs_pb2, spec, wait_for
from tally.v1 import workers_pb2, workers_pb2_grpc


class FakeWorker:
    """A Workers.Connect stream driven by the test: send() queues a message,
    received holds what tallyd sent, error the status that ended the stream."""

    def __init__(self, channel, hello):
        self.outbox = queue.Queue()
        self.received = []
        self.error = None
        self.done = threading.Event()
        self.outbox.put(workers_pb2.WorkerMessage(hello=hello))
        self.call = workers_pb2_grpc.WorkersStub(channel).Connect(self._requests())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _requests(self):
        while True:
            m = self.outbox.get()
            if m is None:
                return
            yield m

    def _read(self):
        try:
            for m in self.call:
                self.received.append(m)
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.done.set()

    def send(self, **fields):
        self.outbox.put(workers_pb2.WorkerMessage(**fields))

    def kinds(self):
        return [m.WhichOneof("msg") for m in self.received]

    def assignments(self):
        return [m.assignment for m in self.received if m.HasField("assignment")]

    def close(self):
        self.outbox.put(None)
        self.call.cancel()
        self.thread.join(timeout=10)


def hello(worker_id, gpu_type="fake", slots=1):
    return workers_pb2.Hello(worker_id=worker_id, device="cpu", gpu_type=gpu_type,
                             slots=slots, version="test")


class StreamsTest(ClusterTest):

    def fake_worker(self, h):
        w = FakeWorker(self.tallyd.channel, h)
        self.addCleanup(w.close)
        return w

    def test_rejected_hello_does_not_close_the_live_workers_stream(self):
        live = self.fake_worker(hello("w1"))
        wait_for(lambda: "welcome" in live.kinds(), what="the live worker's Welcome")
        # A second stream claims w1's id with a Hello tallyd rejects.
        bad = self.fake_worker(hello("w1", slots=0))
        self.assertTrue(bad.done.wait(10), "the bad Hello's stream did not end")
        self.assertEqual(bad.error.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("hello.slots", bad.error.details())
        self.assertEqual(bad.received, [], "the rejected stream was sent something")
        # w1's stream is still its stream: it gets the next assignment.
        live.send(heartbeat=workers_pb2.Heartbeat())
        job = self.submit(spec(gpu_type="fake"))
        wait_for(lambda: live.assignments(), what="an assignment on the live stream")
        self.assertIsNone(live.error, "the live worker's stream was closed")
        self.assertFalse(live.done.is_set())
        self.assertEqual(live.assignments()[0].job, job.name)
        self.assertEqual(self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING).worker_ids,
                         ["w1"])

    def test_first_message_must_be_a_hello(self):
        call = workers_pb2_grpc.WorkersStub(self.tallyd.channel).Connect(
            iter([workers_pb2.WorkerMessage(heartbeat=workers_pb2.Heartbeat())]), timeout=10)
        with self.assertRaises(grpc.RpcError) as err:
            list(call)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("Hello", err.exception.details())

    def test_a_second_stream_for_a_live_worker_is_refused(self):
        live = self.fake_worker(hello("w1"))
        wait_for(lambda: "welcome" in live.kinds(), what="the first Welcome")
        live.send(heartbeat=workers_pb2.Heartbeat())
        second = self.fake_worker(hello("w1"))
        self.assertTrue(second.done.wait(10), "the second stream was not refused")
        self.assertEqual(second.error.code(), grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("one stream", second.error.details())
        self.assertFalse(live.done.is_set(), "the live stream was closed")

    def test_reconnect_replaces_a_silent_stream(self):
        # tallyd here declares a worker silent after 3 s without a message.
        old = self.fake_worker(hello("w1"))
        wait_for(lambda: "welcome" in old.kinds(), what="the first Welcome")
        time.sleep(3.5)
        new = self.fake_worker(hello("w1"))
        wait_for(lambda: "welcome" in new.kinds(), what="the second Welcome")
        self.assertTrue(old.done.wait(10), "the replaced stream was not closed")
        job = self.submit(spec(gpu_type="fake"))
        wait_for(lambda: new.assignments(), what="the assignment on the new stream")
        self.assertEqual(new.assignments()[0].job, job.name)

    def test_watchers_get_every_event_in_order_while_events_are_produced(self):
        w = self.fake_worker(hello("w1"))
        job = self.submit(spec(gpu_type="fake", max_steps=1000))
        wait_for(lambda: w.assignments(), what="the assignment")
        attempt = w.assignments()[0].attempt

        results = {}

        def watch(key, after):
            got = []
            try:
                for e in self.tallyd.jobs.WatchJob(
                        jobs_pb2.WatchJobRequest(name=job.name, after_sequence=after),
                        timeout=120):
                    got.append(e)
                results[key] = (after, got, None)
            except grpc.RpcError as e:
                results[key] = (after, got, e)

        threads = []

        def start(key, after):
            t = threading.Thread(target=watch, args=(key, after))
            t.start()
            threads.append(t)

        for i in range(4):
            start("early-%d" % i, 0)
        num_evals = 400
        for step in range(1, num_evals + 1):
            w.send(eval=workers_pb2.EvalResult(job=job.name, attempt=attempt, step=step,
                                               tokens=step * 128, val_loss=10.0 / step,
                                               bits_per_byte=1.0))
            if step % 100 == 0:
                # Watchers that join mid-stream: from the start, and from the
                # middle.
                start("mid-%d" % step, 0)
                start("tail-%d" % step, step // 2)
        w.send(exit=workers_pb2.AttemptExit(job=job.name, attempt=attempt,
                                            outcome=workers_pb2.ATTEMPT_OUTCOME_SUCCEEDED,
                                            step=num_evals))
        for t in threads:
            t.join(timeout=120)
        final = self.get(job.name)
        self.assertEqual(final.state, jobs_pb2.JOB_STATE_SUCCEEDED)
        last = final.last_event_sequence
        self.assertGreater(last, num_evals)
        reference = self.events(job.name)
        self.assertEqual([e.sequence for e in reference], list(range(1, last + 1)))
        self.assertEqual(len(results), len(threads))
        for key, (after, got, err) in sorted(results.items()):
            self.assertIsNone(err, "%s ended with %s" % (key, err))
            self.assertEqual([e.sequence for e in got], list(range(after + 1, last + 1)),
                             "%s: a gap, a repeat or a missing tail" % key)
            self.assertEqual(got, reference[after:], "%s: events differ from the stored ones" % key)
            self.assertEqual(got[-1].state, jobs_pb2.JOB_STATE_SUCCEEDED)


class StreamLimitTest(unittest.TestCase):

    def start_tallyd(self, *args):
        t = Tallyd(tempfile.mkdtemp(prefix="tally_it_"), list(args))
        self.addCleanup(t.stop)
        return t

    def open_watches(self, tallyd, name, n):
        streams = []
        for _ in range(n):
            s = tallyd.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=name), timeout=60)
            self.assertEqual(next(s).sequence, 1)  # open and counted
            streams.append(s)
        return streams

    def assert_refused(self, tallyd, name, flag):
        with self.assertRaises(grpc.RpcError) as err:
            next(tallyd.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=name), timeout=10))
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn(flag, err.exception.details())

    def test_per_caller_limit_is_resource_exhausted_naming_the_flag(self):
        t = self.start_tallyd("--max_watch_streams_per_principal=3")
        name = t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10).name
        streams = self.open_watches(t, name, 3)
        self.assert_refused(t, name, "--max_watch_streams_per_principal=3")
        # Unary calls are not limited.
        self.assertEqual(t.jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10).name, name)
        streams.pop().cancel()

        def reopened():
            try:
                s = t.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=name), timeout=60)
                next(s)
                streams.append(s)
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                return False

        wait_for(reopened, timeout=10, interval=0.1, what="a closed stream's place to free up")
        for s in streams:
            s.cancel()

    def test_total_limit_is_resource_exhausted_naming_the_flag(self):
        t = self.start_tallyd("--max_watch_streams=2", "--max_watch_streams_per_principal=0")
        name = t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10).name
        streams = self.open_watches(t, name, 2)
        self.assert_refused(t, name, "--max_watch_streams=2")
        for s in streams:
            s.cancel()

    def test_worker_streams_are_limited_per_caller_hello_or_not(self):
        t = self.start_tallyd("--max_worker_streams_per_principal=2")

        def silent_stream():
            # Opens a Connect stream and never sends a Hello.
            gate = threading.Event()

            def requests():
                gate.wait()
                return
                yield  # a generator that sends nothing

            call = workers_pb2_grpc.WorkersStub(t.channel).Connect(requests(), timeout=30)
            self.addCleanup(gate.set)
            return call

        silent = [silent_stream(), silent_stream()]
        time.sleep(1)  # both are open and counted

        def third_refused():
            w = FakeWorker(t.channel, hello("w9"))
            self.addCleanup(w.close)
            self.assertTrue(w.done.wait(10), "the third stream was not refused")
            return w.error

        err = third_refused()
        self.assertEqual(err.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("--max_worker_streams_per_principal=2", err.details())
        for call in silent:
            call.cancel()

        def admitted():
            w = FakeWorker(t.channel, hello("w9"))
            self.addCleanup(w.close)
            wait_for(lambda: w.done.is_set() or "welcome" in w.kinds(), what="an answer")
            return "welcome" in w.kinds()

        wait_for(admitted, timeout=10, interval=0.2, what="a closed stream's place to free up")

    def test_negative_limit_is_a_clear_error(self):
        d = tempfile.mkdtemp()
        r = subprocess.run([TALLYD, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                            "--data_dir=" + d, "--max_watch_streams_per_principal=-1"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--max_watch_streams_per_principal", r.stderr + r.stdout)


if __name__ == "__main__":
    unittest.main()
