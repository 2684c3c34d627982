"""tallyd on PostgreSQL (--store=postgres) while PostgreSQL itself goes away
under load: a fast restart, then a stop lasting a few seconds.

Clients submit continuously, each submit with a request id and retried with
it while tallyd answers UNAVAILABLE; one worker trains a long job. While the
database is down every submit must end UNAVAILABLE within its deadline (not
INTERNAL, not a hang), and tallyd must stay up, or exit with code 3 (a
COMMIT whose outcome it could not know: it must recover from the store), in
which case it is started again and must recover. Afterwards every
acknowledged submit exists exactly once, under the name it was acknowledged
with, nothing exists that was not submitted, no job's events have a
sequence gap, and the long job completes.

The worker is given a dead address before tallyd's (--controller=DEAD,LIVE):
it must find tallyd by moving on to the next address.
"""

import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import harness
from harness import Tallyd, Worker, free_port, jobs_pb2, jobs_pb2_grpc, spec, wait_for
from postgres import DatabaseTestCase

# Long enough that a few seconds without the database cost no leadership;
# short enough that a tallyd that had to exit takes the lease back soon.
LEASE = "10s"
SUBMITTERS = 3
CALL_DEADLINE_S = 6.0
DOWN_SECONDS = 4.0
# A submit acknowledged with nothing committed is what this test is after;
# one refused for this long means tallyd never came back.
GIVE_UP_SECONDS = 90.0


class Call(collections.namedtuple("Call", "start end code")):
    """One SubmitJob call: monotonic start and end, and its status code."""


class Submitter(threading.Thread):
    """Submits small jobs one after another, each with a request id of its
    own, retrying each with that id while tallyd answers UNAVAILABLE."""

    def __init__(self, index, addr, stop):
        super().__init__(daemon=True, name="submitter-%d" % index)
        self.index = index
        self.stop = stop
        # Reconnect quickly to a restarted tallyd (gRPC's own backoff grows
        # to minutes).
        self.channel = grpc.insecure_channel(addr, options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])
        self.jobs = jobs_pb2_grpc.JobsStub(self.channel)
        self.calls = []        # every Call
        self.acked = {}        # request id -> job name acknowledged
        self.abandoned = []    # request ids given up on (never acknowledged)
        self.tried = []        # every request id sent at least once
        self.errors = []       # unexpected exceptions

    def run(self):
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                rid = "pg-restart-%d-%d" % (self.index, n)
                self.tried.append(rid)
                first = time.monotonic()
                while True:
                    start = time.monotonic()
                    try:
                        job = self.jobs.SubmitJob(
                            jobs_pb2.SubmitJobRequest(spec=spec(max_steps=5, name=rid),
                                                      request_id=rid),
                            timeout=CALL_DEADLINE_S)
                        self.calls.append(Call(start, time.monotonic(), grpc.StatusCode.OK))
                        self.acked[rid] = job.name
                        break
                    except grpc.RpcError as e:
                        self.calls.append(Call(start, time.monotonic(), e.code()))
                        # CANCELLED unasked: the tallyd serving it went away.
                        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                            grpc.StatusCode.DEADLINE_EXCEEDED,
                                            grpc.StatusCode.CANCELLED):
                            break  # recorded: the test fails on it
                        if time.monotonic() - first > GIVE_UP_SECONDS:
                            self.abandoned.append(rid)
                            break
                        time.sleep(0.05)
                time.sleep(0.02)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.errors.append(repr(e))
        finally:
            self.channel.close()


class PostgresRestartTest(DatabaseTestCase):

    def setUp(self):
        self.create_database()
        self.dir = tempfile.mkdtemp(prefix="tally_pg_it_")
        # tallyd's default heartbeat timeout (the harness's 3 s is shorter
        # than a worker's reconnect backoff can grow while tallyd is away),
        # so a worker back after an outage finds its attempt to re-adopt.
        self.tallyd = Tallyd(self.dir, ["--store=postgres", "--postgres_dsn=" + self.dsn,
                                        "--lease_timeout=" + LEASE, "--heartbeat_timeout=10s"])
        self.wait_leader()
        self.workers = []
        self.exits = []   # exit codes of tallyd processes that ended by themselves
        self.exit_times = []  # when each was seen to have exited (monotonic)
        self.tallyd_lock = threading.Lock()

    def tearDown(self):
        for w in self.workers:
            w.kill()
        with self.tallyd_lock:
            self.tallyd.stop()
        if harness.test_failed(self):
            print("--- tallyd log ---\n" + self.tallyd.logs(), file=sys.stderr)
            for w in self.workers:
                with open(w.log_path) as f:
                    print("--- %s log ---\n%s" % (w.worker_id, f.read()), file=sys.stderr)
            print("--- postgres log (tail) ---\n" + self.pg.logs()[-8000:], file=sys.stderr)

    def wait_leader(self, timeout=60):
        wait_for(self.tallyd.ready, timeout=timeout, what="tallyd to lead (/readyz 200)")

    def sql(self, query):
        return self.pg.psql(query, dbname=self.dbname)

    def check_exits(self):
        bad = [code for code in self.exits if code != 3]
        if bad:
            raise AssertionError("tallyd exited with code %s; only 3 (its state unknown: "
                                 "restart and recover from the store) is allowed" % bad)

    def get_job(self, name, timeout=60):
        """GetJob, retried while tallyd is UNAVAILABLE (restarting after
        exit 3, or a standby until the lease is free)."""
        def attempt():
            self.check_exits()
            try:
                return self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=name),
                                               timeout=CALL_DEADLINE_S)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return None
        return wait_for(attempt, timeout=timeout, interval=0.1, what="GetJob %s" % name)

    def watch_tallyd(self, stop):
        """Restarts tallyd when it exits by itself (the exit code is kept for
        the test to judge), as Kubernetes would."""
        while not stop.is_set():
            with self.tallyd_lock:
                code = self.tallyd.proc.poll()
                if code is not None:
                    self.exits.append(code)
                    self.exit_times.append(time.monotonic())
                    self.tallyd.channel.close()
                    self.tallyd.log.close()
                    if code != 3 or len(self.exits) > 3:
                        return
                    self.tallyd.start()
            time.sleep(0.05)

    def test_postgres_restarted_under_load(self):
        dead = "127.0.0.1:%d" % free_port()
        worker = Worker(dead + "," + self.tallyd.grpc_addr, "w1", self.dir)
        self.workers.append(worker)
        long_spec = spec(max_steps=20000, name="long", checkpoint_interval=500)
        long_job = self.tallyd.jobs.SubmitJob(
            jobs_pb2.SubmitJobRequest(spec=long_spec, request_id="long"), timeout=10)
        wait_for(lambda: self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=long_job.name),
                                                 timeout=10).state == jobs_pb2.JOB_STATE_RUNNING,
                 timeout=60, what="the long job to run on the worker found past a dead address")

        stop_submitting = threading.Event()
        stop_watching = threading.Event()
        watcher = threading.Thread(target=self.watch_tallyd, args=(stop_watching,), daemon=True)
        watcher.start()
        submitters = [Submitter(i, self.tallyd.grpc_addr, stop_submitting)
                      for i in range(SUBMITTERS)]
        for s in submitters:
            s.start()
        try:
            time.sleep(2)
            self.pg.restart()
            time.sleep(3)
            running = self.get_job(long_job.name)
            self.assertEqual(running.state, jobs_pb2.JOB_STATE_RUNNING,
                             "the long job must still run when the database stops; raise its "
                             "max_steps")
            down_at = time.monotonic()
            self.pg.stop()
            time.sleep(DOWN_SECONDS)
            up_at = time.monotonic()
            self.pg.start()
            time.sleep(4)
        finally:
            stop_submitting.set()
            for s in submitters:
                s.join(timeout=GIVE_UP_SECONDS + 30)
        # tallyd serves again: the same process, or one started after exit 3.
        wait_for(lambda: self.check_exits() or
                 (self.tallyd.proc.poll() is None and self.tallyd.ready()), timeout=60,
                 what="tallyd to lead again after the database came back")
        terminal = (jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED,
                    jobs_pb2.JOB_STATE_CANCELLED)
        done = wait_for(lambda: (lambda j: j if j.state in terminal else None)(
            self.get_job(long_job.name)), timeout=300, what="the long job to end")
        stop_watching.set()
        watcher.join(timeout=10)
        # tallyd stayed up, or left only with code 3 and recovered.
        self.check_exits()

        # Every call ended within its deadline, and every failure was
        # UNAVAILABLE: never INTERNAL or anything else. The one exception:
        # a tallyd exiting with code 3 cuts the calls still in flight short,
        # and gRPC reports those CANCELLED.
        calls = [c for s in submitters for c in s.calls]
        self.assertEqual([e for s in submitters for e in s.errors], [])
        by_code = collections.Counter(c.code for c in calls)
        cut = [c for c in calls if c.code == grpc.StatusCode.CANCELLED and
               any(t - 5 <= c.end <= t + 0.5 for t in self.exit_times)]
        others = collections.Counter(c.code for c in calls if c not in cut)
        self.assertEqual(set(others) - {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(),
                         "submit outcomes: %s (tallyd exits: %s)" % (dict(by_code), self.exits))
        slowest = max(c.end - c.start for c in calls)
        self.assertLess(slowest, CALL_DEADLINE_S, "a submit took %.1fs" % slowest)
        # While the database was down (a margin for calls already in flight),
        # nothing could commit: every submit answered UNAVAILABLE.
        inside = [c for c in calls if c.start >= down_at + 0.5 and c.end <= up_at]
        self.assertTrue(inside, "no submit ran while the database was down")
        self.assertEqual({c.code for c in inside if c not in cut}, {grpc.StatusCode.UNAVAILABLE},
                         "submits while the database was down: %s"
                         % collections.Counter(c.code for c in inside))
        self.assertTrue(any(c.code == grpc.StatusCode.OK and c.start > up_at for c in calls),
                        "no submit was acknowledged after the database came back")
        self.assertEqual([r for s in submitters for r in s.abandoned], [])

        # Every acknowledged submit exists exactly once, under its name;
        # nothing exists that was not submitted.
        acked = {}
        for s in submitters:
            acked.update(s.acked)
        tried = {r for s in submitters for r in s.tried} | {"long"}
        rows = [line.split("|") for line in
                self.sql("SELECT request_id, id FROM jobs ORDER BY id").splitlines() if line]
        stored = collections.Counter(rid for rid, _ in rows)
        self.assertEqual([r for r, n in stored.items() if n != 1], [])
        self.assertEqual(sorted(set(stored) - tried), [], "jobs nobody submitted")
        for rid, name in acked.items():
            self.assertIn(rid, stored, "acknowledged %s (%s) is not stored" % (rid, name))
            job = self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10)
            self.assertEqual(job.request_id, rid)
        self.assertGreater(len(acked), 10)

        # No job's events have a sequence gap (nor a repeat): 1..n each.
        gaps = self.sql("SELECT job_id, count(*), min(seq), max(seq) FROM events "
                        "GROUP BY job_id HAVING count(*) <> max(seq) OR min(seq) <> 1")
        self.assertEqual(gaps.strip(), "", "job_id|count|min|max of jobs with gaps")
        events = list(self.tallyd.jobs.WatchJob(
            jobs_pb2.WatchJobRequest(name=long_job.name), timeout=60))
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))

        # The running job completed, every step of it.
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done)
        self.assertEqual(done.step, long_spec.training.max_steps)
        self.assertEqual(events[-1].type, "succeeded")
        print("submits: %d calls %s, %d acknowledged; tallyd exits: %s; long job: attempt %d"
              % (len(calls), {k.name: v for k, v in by_code.items()},
                 len(acked), self.exits or "none", done.attempt), file=sys.stderr)
        for line in self.tallyd.logs().splitlines():
            if "lease" in line or "exit code" in line:
                print("  tallyd: " + line, file=sys.stderr)
        for e in events:
            if e.type not in ("progress", "checkpoint"):
                print("  #%d %s attempt %d: %s %s" % (e.sequence, e.type, e.attempt, e.reason,
                                                     e.detail), file=sys.stderr)

    def test_a_lone_leader_outlives_a_database_stop_longer_than_its_lease(self):
        """PostgreSQL stopped for longer than --lease_timeout, with no standby:
        the leader's lease lapses, so it refuses every call (UNAVAILABLE, not
        ready) and ends its streams, but it does not exit; once PostgreSQL is
        back its renewal finds the lease still its own, and the same process
        serves again, its job still running."""
        self.tallyd.stop()
        self.tallyd = Tallyd(self.dir, ["--store=postgres", "--postgres_dsn=" + self.dsn,
                                        "--lease_timeout=3s", "--heartbeat_timeout=30s"])
        self.wait_leader()
        worker = Worker(self.tallyd.grpc_addr, "w1", self.dir)
        self.workers.append(worker)
        long_spec = spec(max_steps=20000, name="long", checkpoint_interval=500)
        long_job = self.tallyd.jobs.SubmitJob(
            jobs_pb2.SubmitJobRequest(spec=long_spec, request_id="long"), timeout=10)
        wait_for(lambda: self.get_job(long_job.name).state == jobs_pb2.JOB_STATE_RUNNING,
                 timeout=60, what="the long job to run")
        pid = self.tallyd.proc.pid
        self.pg.stop()
        try:
            # Past the lease (3 s) and then some: refused, not ready, alive.
            def refused():
                try:
                    self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=long_job.name),
                                            timeout=2)
                    return None
                except grpc.RpcError as e:
                    return e if e.code() == grpc.StatusCode.UNAVAILABLE and \
                        "lease has lapsed" in (e.details() or "") else None
            err = wait_for(refused, timeout=30, what="calls refused once the lease lapsed")
            self.assertFalse(self.tallyd.ready(), "/readyz during the lapse")
            time.sleep(4)
            self.assertIsNone(self.tallyd.proc.poll(), "tallyd exited during the lapse")
        finally:
            self.pg.start()
        wait_for(self.tallyd.ready, timeout=60, what="tallyd to serve again")
        self.assertIsNone(self.tallyd.proc.poll())
        self.assertEqual(self.tallyd.proc.pid, pid, "the same process")
        self.assertIn("renewed the leader lease after its lapse", self.tallyd.logs())
        # The worker comes back to its attempt, which trains on.
        job = self.get_job(long_job.name)
        step = job.step
        wait_for(lambda: self.get_job(long_job.name).step > step + 5, timeout=120,
                 what="the job to train on after the lapse")
        job = self.get_job(long_job.name)
        self.assertEqual(job.state, jobs_pb2.JOB_STATE_RUNNING)
        print("refused during the lapse: %s; after: attempt %d, step %d"
              % (err.details()[:80], job.attempt, job.step), file=sys.stderr)
        self.assertEqual(job.attempt, 1, "the attempt survived the lapse")

    def test_clients_move_past_a_dead_address_and_a_standby(self):
        """tallyctl and tally-worker given a dead address and a standby
        before the leader reach the leader; the standby answers UNAVAILABLE
        naming it."""
        standby_dir = os.path.join(self.dir, "standby")
        os.makedirs(standby_dir)
        standby = Tallyd(standby_dir, ["--store=postgres", "--postgres_dsn=" + self.dsn,
                                       "--lease_timeout=" + LEASE])
        try:
            self.assertFalse(standby.ready())

            def refusal():
                with self.assertRaises(grpc.RpcError) as refused:
                    standby.jobs.GetJob(jobs_pb2.GetJobRequest(name="jobs/1"), timeout=10)
                self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAVAILABLE)
                return refused.exception.details()
            # Named once the standby has read the lease (it serves its
            # refusals from the start, naming no leader until then).
            details = wait_for(lambda: (lambda d: d if self.tallyd.grpc_addr in d else None)(
                refusal()), timeout=30, what="the standby to name the leader")
            self.assertIn("this tallyd is a standby", details)

            dead = "127.0.0.1:%d" % free_port()
            controllers = ",".join([dead, standby.grpc_addr, self.tallyd.grpc_addr])
            spec_file = os.path.join(self.dir, "job.yaml")
            with open(spec_file, "w") as f:
                f.write("display_name: via-list\nmodel: {num_layers: 1, d_model: 16, "
                        "num_heads: 2}\ndata: {train_path: %s, seq_len: 64}\ntraining: "
                        "{micro_batch_rows: 2, max_steps: 10, seed: 1}\nresources: "
                        "{gpu_type: cpu, gpu_count: 1}\n" % spec().data.train_path)
            env = dict(os.environ, TALLY_CONTROLLER=controllers)
            for attempt in range(2):  # the second, with the same id, makes nothing new
                r = subprocess.run([harness.TALLYCTL, "submit", "-f", spec_file,
                                    "--request_id=via-list", "--wait=false"],
                                   capture_output=True, text=True, env=env, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.strip(), "jobs/1")
            self.assertEqual(self.sql("SELECT count(*) FROM jobs").strip(), "1")

            self.workers.append(Worker(controllers, "w-list", self.dir))
            r = subprocess.run([harness.TALLYCTL, "watch", "jobs/1"], capture_output=True,
                               text=True, env=env, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("succeeded", r.stdout)
            with open(self.workers[-1].log_path) as f:
                log = f.read()
            self.assertIn("connecting to tallyd at %s (address 1 of 3)" % dead, log)
            self.assertIn("connecting to tallyd at %s (address 2 of 3)" % standby.grpc_addr, log)

            r = subprocess.run([harness.TALLYCTL, "--controller=%s,%s" % (dead, dead), "get",
                                "jobs/1"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("given twice", r.stderr)
            r = subprocess.run([harness.TALLYCTL, "--controller=%s,%s" % (dead, standby.grpc_addr),
                                "--timeout=5s", "get", "jobs/1"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 5, r.stderr)
            self.assertIn("no tallyd of %s, %s answered" % (dead, standby.grpc_addr), r.stderr)
            self.assertIn("standby", r.stderr)
        finally:
            standby.stop()


if __name__ == "__main__":
    unittest.main()
