"""tallyd + tally-worker on loopback: a job's whole life, watch resume,
kill -9 of tallyd, a worker lost mid-job, concurrent and repeated submits."""

import concurrent.futures
import os
import re
import signal
import subprocess
import time
import unittest

import grpc
from harness import STORE, ClusterTest, Tallyd, events_so_far, jobs_pb2, spec, wait_for


class LifecycleTest(ClusterTest):

    def test_python_client_submits_and_watches_to_the_end(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=20))
        self.assertEqual(job.state, jobs_pb2.JOB_STATE_QUEUED)
        self.assertTrue(job.name.startswith("jobs/"))
        events = self.events(job.name)  # ends by itself once the job is terminal
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))
        types = [e.type for e in events]
        self.assertEqual(types[0], "submitted")
        self.assertIn("started", types)
        self.assertEqual(types[-1], "succeeded")
        self.assertEqual(events[-1].state, jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertIn("trained 20 steps", events[-1].reason)
        self.assertTrue(any(e.type == "progress" and e.train_loss > 0 for e in events))
        final = self.get(job.name)
        self.assertEqual(final.state, jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(final.step, 20)
        self.assertEqual(final.attempt, 1)
        self.assertEqual(list(final.worker_ids), ["w1"])

    def test_watch_resumes_at_its_sequence_number(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=400))
        stream = self.tallyd.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=job.name))
        first = []
        for e in stream:
            first.append(e)
            if len(first) == 3:
                break
        stream.cancel()
        rest = self.events(job.name, after=first[-1].sequence)
        seqs = [e.sequence for e in first + rest]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "no gap, no repeat")
        self.assertEqual(rest[-1].state, jobs_pb2.JOB_STATE_SUCCEEDED)
        # Watching a finished job from the middle returns the tail and ends.
        tail = self.events(job.name, after=len(seqs) - 2)
        self.assertEqual([e.sequence for e in tail], seqs[-2:])

    def test_kill_9_loses_nothing_acknowledged(self):
        self.add_worker("w1")
        names = [self.submit(spec(max_steps=3000 if i == 0 else 15, name="j%d" % i)).name
                 for i in range(5)]
        running = self.wait_state(names[0], jobs_pb2.JOB_STATE_RUNNING)
        self.assertEqual(running.attempt, 1)
        before = {n: self.get(n) for n in names}
        events_before = {n: self.events_so_far(n) for n in names}
        self.assertEqual(self.tallyd.kill(signal.SIGKILL), -signal.SIGKILL)
        self.tallyd.start()
        for n in names:
            job = self.get(n)
            self.assertEqual(job.spec, before[n].spec)
            self.assertEqual(job.create_time, before[n].create_time)
            got = self.events_so_far(n)
            self.assertEqual(got[:len(events_before[n])], events_before[n])
        # The worker reconnects and the running attempt is re-adopted, not redone.
        done = self.wait_state(names[0], jobs_pb2.JOB_STATE_SUCCEEDED, timeout=60)
        self.assertEqual(done.attempt, 1)
        self.assertIn("adopted", [e.type for e in self.events(names[0])])
        for n in names[1:]:
            self.assertEqual(self.wait_state(n, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=60).attempt, 1)

    def events_so_far(self, name):
        return events_so_far(self.tallyd.jobs, name)

    def test_worker_killed_mid_job_moves_to_another_worker(self):
        a = self.add_worker("a")
        job = self.submit(spec(max_steps=3000, checkpoint_interval=100))
        running = self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        self.assertEqual(list(running.worker_ids), ["a"])
        ckpts = lambda: self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        wait_for(lambda: len(ckpts()) >= 2, what="two checkpoints", timeout=60)
        b = self.add_worker("b")
        a.kill(signal.SIGKILL)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED,
                                          jobs_pb2.JOB_STATE_FAILED}, timeout=60)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(done.attempt, 2)
        self.assertEqual(list(done.worker_ids), ["b"])
        events = self.events(job.name)
        requeued = [e for e in events if e.type == "requeued"]
        self.assertEqual(len(requeued), 1)
        self.assertIn("worker a silent", requeued[0].reason)
        # Attempt 2 resumed from the last checkpoint attempt 1 wrote.
        started = [e for e in events if e.type == "started" and e.attempt == 2]
        self.assertEqual(len(started), 1)
        m = re.search(r"resuming from step (\d+)", started[0].detail)
        self.assertIsNotNone(m, started[0].detail)
        resumed_at = int(m.group(1))
        self.assertGreaterEqual(resumed_at, 200)
        self.assertTrue(any(c.attempt == 1 and c.step == resumed_at for c in ckpts()))
        self.assertEqual(min(c.step for c in ckpts() if c.attempt == 2), resumed_at + 100)
        self.assertEqual(ckpts()[-1].step, 3000)
        del b

    def test_200_concurrent_submits_and_repeated_request_ids(self):
        ids = ["req-%03d" % i for i in range(200)]

        def submit(request_id):
            return self.submit(spec(max_steps=1), request_id=request_id).name

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            names = list(pool.map(submit, ids))
            again = list(pool.map(submit, ids[:50]))
        self.assertEqual(len(set(names)), 200, "every submit acknowledged with its own job")
        self.assertEqual(again, names[:50], "a repeated request_id returns the same job")
        listed, token = [], ""
        while True:
            page = self.tallyd.jobs.ListJobs(
                jobs_pb2.ListJobsRequest(page_size=64, page_token=token), timeout=10)
            listed += [j.name for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(sorted(listed), sorted(names))
        with self.assertRaises(grpc.RpcError) as err:
            self.submit(spec(max_steps=2), request_id="req-000")
        self.assertEqual(err.exception.code(), grpc.StatusCode.ALREADY_EXISTS)

    def test_bad_spec_names_the_field_and_stores_nothing(self):
        bad = spec()
        bad.model.num_heads = 3
        bad.data.seq_len = 2
        with self.assertRaises(grpc.RpcError) as err:
            self.submit(bad)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.model.num_heads", err.exception.details())
        self.assertIn("spec.data.seq_len", err.exception.details())
        with self.assertRaises(grpc.RpcError) as err:
            self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(), timeout=10)
        self.assertIn("spec", err.exception.details())
        self.assertEqual(len(self.tallyd.jobs.ListJobs(jobs_pb2.ListJobsRequest()).jobs), 0)
        for bad_name in ["", "jobs/x", "42", "jobs/-1"]:
            with self.assertRaises(grpc.RpcError) as err:
                self.get(bad_name)
            self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as err:
            self.tallyd.jobs.ListJobs(jobs_pb2.ListJobsRequest(page_token="zz"), timeout=10)
        self.assertIn("page_token", err.exception.details())

    def test_cancel_running_job_stops_the_worker(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=100000))
        self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        cancelled = self.tallyd.jobs.CancelJob(
            jobs_pb2.CancelJobRequest(name=job.name, reason="wrong lr"), timeout=10)
        self.assertEqual(cancelled.state, jobs_pb2.JOB_STATE_CANCELLED)
        with self.assertRaises(grpc.RpcError) as err:
            self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name), timeout=10)
        self.assertEqual(err.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        # The freed worker takes the next job.
        nxt = self.submit(spec(max_steps=5))
        self.assertEqual(self.wait_state(nxt.name, jobs_pb2.JOB_STATE_SUCCEEDED).attempt, 1)
        self.assertLess(self.get(job.name).step, 100000)

    def test_health_and_reflection(self):
        check = self.tallyd.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda _: b"", response_deserializer=lambda b: b)
        self.assertEqual(check(None, timeout=5), b"\x08\x01")  # status: SERVING
        reflect = self.tallyd.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        reply = b"".join(reflect(iter([b"\x3a\x00"]), timeout=5))  # list_services
        self.assertIn(b"tally.v1.Jobs", reply)
        self.assertIn(b"tally.v1.Workers", reply)
        self.assertIn(b"grpc.health.v1.Health", reply)

    def test_sigterm_drains_and_exits_cleanly(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=100000))
        self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        stream = self.tallyd.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=job.name))
        next(stream)
        self.tallyd.proc.send_signal(signal.SIGTERM)
        with self.assertRaises(grpc.RpcError) as err:
            for _ in stream:
                pass
        # Watchers are told to come back, with where to resume.
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("after_sequence=", err.exception.details())
        self.assertEqual(self.tallyd.kill(signal.SIGTERM), 0)
        self.assertIn("draining", self.tallyd.logs())
        self.tallyd.start()  # so tearDown has something to stop
        self.assertEqual(self.get(job.name).state, jobs_pb2.JOB_STATE_RUNNING)


class FlagsTest(unittest.TestCase):

    def test_bad_flags_are_clear_errors(self):
        import subprocess
        import tempfile
        from harness import TALLYD
        d = tempfile.mkdtemp()
        for args, expect in [(["--listen=nonsense"], "--listen"),
                             (["--store=postgres"], "--store"),
                             (["--heartbeat_timeout=1s", "--heartbeat_interval=2s"],
                              "--heartbeat_timeout"),
                             (["--data_dir=/proc/nope"], "--data_dir")]:
            r = subprocess.run([TALLYD, "--metrics_listen=127.0.0.1:0", "--data_dir=" + d] + args,
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(expect, r.stderr + r.stdout)
        r = subprocess.run([TALLYD, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--data_dir", r.stdout + r.stderr)

    def test_bad_address_file_is_refused_before_serving(self):
        import socket
        import subprocess
        import tempfile
        import time
        from harness import TALLYD, free_port
        d = tempfile.mkdtemp()
        grpc_port, metrics_port = free_port(), free_port()

        def accepts(port):
            with socket.socket() as s:
                s.settimeout(0.2)
                return s.connect_ex(("127.0.0.1", port)) == 0

        proc = subprocess.Popen(
            [TALLYD, "--listen=127.0.0.1:%d" % grpc_port,
             "--metrics_listen=127.0.0.1:%d" % metrics_port, "--data_dir=" + d,
             "--address_file=/nonexistent-dir/addr"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        served = []
        try:
            # Probe both ports for as long as it lives: nothing may answer.
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                served += [p for p in (grpc_port, metrics_port) if accepts(p)]
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                proc.kill()
            output = proc.communicate(timeout=30)[0]
        self.assertEqual(proc.returncode, 2, output)
        self.assertIn("--address_file", output)
        self.assertIn("/nonexistent-dir/addr", output)
        self.assertEqual(served, [], "accepted connections before refusing --address_file: "
                         + output)
        self.assertFalse(accepts(grpc_port), "something still listens on the --listen port")
        self.assertFalse(accepts(metrics_port), "something still listens on --metrics_listen")


if __name__ == "__main__":
    unittest.main()


class FullDiskTest(ClusterTest):
    """tallyd's data directory on a small tmpfs that fills up mid-job: while
    SQLite refuses writes, the worker trains on; once space frees, the job
    ends SUCCEEDED on its first attempt with all its steps (nothing lost,
    nothing counted against max_attempts)."""

    def setUp(self):
        super().setUp()
        if STORE != "sqlite":
            self.skipTest("the full disk is SQLite's (TALLY_TEST_STORE=%s)" % STORE)
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        self.mount = os.path.join(self.dir, "small")
        os.makedirs(self.mount)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", self.mount],
                       check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.mount], check=False)
        self.tallyd.stop()
        os.makedirs(os.path.join(self.mount, "tallyd"))
        self.tallyd = Tallyd(os.path.join(self.mount, "tallyd"))

    def fill(self):
        """Writes a file until the tmpfs is full; returns its path."""
        path = os.path.join(self.mount, "filler")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 16, 1 << 10, 1):  # to the last byte
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)
        return path

    def test_a_full_data_dir_costs_the_running_job_no_attempt_and_no_step(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=3000, checkpoint_interval=500, max_attempts=3))
        wait_for(lambda: self.get(job.name).step >= 50, timeout=60, what="the job to train")
        filler = self.fill()
        # Full for longer than the heartbeat timeout (3 s here): tallyd cannot
        # record the worker's reports or its reconnections meanwhile.
        wait_for(lambda: not self.tallyd.ready(), timeout=30, interval=0.1,
                 what="tallyd to report it cannot write (/readyz 503)")
        time.sleep(6)
        os.remove(filler)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=120)
        reasons = [(e.type, e.reason) for e in self.events(job.name)]
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertEqual(done.attempt, 1, reasons)
        self.assertEqual(done.step, 3000)
        lost = [e for e in self.events(job.name) if "lost" in e.reason]
        self.assertEqual(lost, [], [e.reason for e in lost])
