"""A leader and a standby tallyd on one PostgreSQL database (--store=postgres):
health and readiness of each, failover after kill -9 with nothing
acknowledged lost and the running attempt re-adopted, fencing of a paused
leader (SIGSTOP/SIGCONT), and the fast hand-over of a clean SIGTERM."""

import collections
import os
import subprocess
import sys
import tempfile
import signal
import threading
import time
import unittest
import urllib.error
import urllib.request

import harness
from harness import Tallyd, Worker, jobs_pb2, jobs_pb2_grpc, spec, wait_for
from postgres import DatabaseTestCase

import grpc

LEASE = "2s"


def health(channel, service=""):
    """The raw grpc.health.v1 status: 1 SERVING, 2 NOT_SERVING."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda name: b"\x0a" + bytes([len(name)]) + name.encode()
        if name else b"",
        response_deserializer=lambda b: b[1] if len(b) == 2 and b[0] == 0x08 else 0)
    return check(service, timeout=5)


def http_status(metrics_addr, path):
    try:
        with urllib.request.urlopen("http://%s%s" % (metrics_addr, path), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def leader_gauge(tallyd):
    return harness.parse_exposition(tallyd.scrape()).get("tally_leader")


class HaTest(DatabaseTestCase):

    def setUp(self):
        self.create_database()
        self.dir = tempfile.mkdtemp(prefix="tally_ha_")
        self.tallyds = []
        self.workers = []

    def tearDown(self):
        for w in self.workers:
            w.kill()
        for t in self.tallyds:
            if t.proc.poll() is None:
                try:
                    os.kill(t.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                t.stop()
        if harness.test_failed(self):
            for i, t in enumerate(self.tallyds):
                print("--- tallyd %d log ---\n%s" % (i, t.logs()), file=sys.stderr)
            for w in self.workers:
                with open(w.log_path) as f:
                    print("--- %s log ---\n%s" % (w.worker_id, f.read()),
                          file=sys.stderr)

    def start_tallyd(self, lease=LEASE, extra=()):
        d = os.path.join(self.dir, "tallyd%d" % len(self.tallyds))
        os.makedirs(d)
        t = Tallyd(d, ["--store=postgres", "--postgres_dsn=" + self.dsn,
                       "--lease_timeout=" + lease] + list(extra))
        self.tallyds.append(t)
        return t

    def wait_leader(self, t, timeout=30):
        def serving():
            try:
                return health(t.channel) == 1
            except grpc.RpcError:
                return False
        wait_for(serving, timeout=timeout, interval=0.02, what="%s to lead" % t.grpc_addr)

    def leader_and_standby(self, lease=LEASE, extra=()):
        a = self.start_tallyd(lease, extra)
        self.wait_leader(a)
        b = self.start_tallyd(lease, extra)

        def names_the_leader():
            try:
                self.get(b, "jobs/1")
            except grpc.RpcError as e:
                return a.grpc_addr in (e.details() or "")
            return False
        # B serves its refusals from the start; it names A once it has read
        # the lease row.
        wait_for(names_the_leader, timeout=30, what="the standby to read the lease")
        return a, b

    def sql(self, query):
        return self.pg.psql(query, dbname=self.dbname).strip()

    def submit(self, t, s, request_id=""):
        return t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=s, request_id=request_id),
                                timeout=10)

    def get(self, t, name):
        return t.jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10)

    def events_so_far(self, t, name):
        return harness.events_so_far(t.jobs, name)

    def wait_state(self, t, name, state, timeout=60):
        return wait_for(lambda: (lambda j: j if j.state == state else None)(self.get(t, name)),
                        timeout=timeout, what="%s to reach %s"
                        % (name, jobs_pb2.JobState.Name(state)))

    def test_one_leader_one_standby(self):
        a, b = self.leader_and_standby()
        self.assertEqual(health(a.channel), 1)
        self.assertEqual(health(a.channel, "tally.live"), 1)
        self.assertEqual(http_status(a.metrics_addr, "/readyz"), 200)
        self.assertEqual(leader_gauge(a), 1)
        # The standby: alive, not ready, and every call names the leader.
        self.assertEqual(health(b.channel), 2)
        self.assertEqual(health(b.channel, "tally.live"), 1)
        self.assertEqual(http_status(b.metrics_addr, "/healthz"), 200)
        self.assertEqual(http_status(b.metrics_addr, "/readyz"), 503)
        self.assertEqual(leader_gauge(b), 0)
        with self.assertRaises(grpc.RpcError) as refused:
            self.submit(b, spec())
        self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("this tallyd is a standby; the leader is %s (epoch 1)" % a.grpc_addr,
                      refused.exception.details())
        self.assertEqual(self.sql("SELECT holder, epoch FROM tally_lease"),
                         "%s|1" % a.grpc_addr)
        self.assertEqual(self.sql("SELECT count(*) FROM jobs"), "0")
        # The password of a DSN never reaches the log.
        self.assertNotIn("password", a.logs() + b.logs())

    def test_kill_9_leader_fails_over_losing_nothing(self):
        # The new leader waits a heartbeat timeout for the workers of the
        # attempts it recovered; the worker's reconnect backoff (up to 5 s)
        # must fit in it, or the attempt is rightly declared lost.
        a, b = self.leader_and_standby(extra=["--heartbeat_timeout=20s"])
        w = Worker(a.grpc_addr + "," + b.grpc_addr, "w1", self.dir)
        self.workers.append(w)
        names = [self.submit(a, spec(max_steps=1500 if i == 0 else 10, name="j%d" % i)).name
                 for i in range(4)]
        running = self.wait_state(a, names[0], jobs_pb2.JOB_STATE_RUNNING)
        self.assertEqual(running.attempt, 1)
        before = {n: self.get(a, n) for n in names}
        events_before = {n: self.events_so_far(a, n) for n in names}
        watched = events_before[names[0]]
        self.assertEqual(a.kill(signal.SIGKILL), -signal.SIGKILL)
        killed_at = time.monotonic()
        self.wait_leader(b)
        print("failover (kill -9 -> standby SERVING): %.2fs" % (time.monotonic() - killed_at),
              file=sys.stderr)
        wait_for(lambda: http_status(b.metrics_addr, "/readyz") == 200, timeout=5,
                 what="the new leader's /readyz")
        self.assertEqual(leader_gauge(b), 1)
        self.assertEqual(self.sql("SELECT epoch FROM tally_lease"), "2")
        for n in names:
            job = self.get(b, n)
            self.assertEqual(job.spec, before[n].spec)
            self.assertEqual(job.create_time, before[n].create_time)
            self.assertEqual(self.events_so_far(b, n)[:len(events_before[n])], events_before[n])
        # A Watch resumed on the new leader from the last sequence seen: no gap.
        resumed = list(b.jobs.WatchJob(
            jobs_pb2.WatchJobRequest(name=names[0], after_sequence=watched[-1].sequence),
            timeout=90))
        seqs = [e.sequence for e in watched + resumed]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "no gap, no repeat")
        self.assertEqual(resumed[-1].state, jobs_pb2.JOB_STATE_SUCCEEDED)
        # The worker moved to the new leader, which re-adopted the running
        # attempt: the same attempt finished, none was started again.
        done = self.get(b, names[0])
        self.assertEqual(done.attempt, 1)
        types = [e.type for e in watched + resumed]
        self.assertIn("adopted", types)
        self.assertEqual(types.count("started"), 1)
        for n in names[1:]:
            self.assertEqual(self.wait_state(b, n, jobs_pb2.JOB_STATE_SUCCEEDED).attempt, 1)

    def test_paused_leader_commits_nothing_after_takeover(self):
        a, b = self.leader_and_standby()
        acked = [self.submit(a, spec(name="before%d" % i)).name for i in range(3)]
        os.kill(a.proc.pid, signal.SIGSTOP)
        # A submit sent to the paused leader waits in its socket; when it
        # wakes, after the standby took over, it must not commit.
        late = {}

        def late_submit():
            try:
                late["reply"] = self.submit(a, spec(name="late"), request_id="late")
            except grpc.RpcError as e:
                late["error"] = e
        sender = threading.Thread(target=late_submit)
        sender.start()
        self.wait_leader(b)
        acked.append(self.submit(b, spec(name="after")).name)
        jobs_now = self.sql("SELECT count(*) FROM jobs")
        events_now = self.sql("SELECT count(*) FROM events")
        self.assertEqual(jobs_now, "4")
        os.kill(a.proc.pid, signal.SIGCONT)
        code = a.proc.wait(timeout=20)
        sender.join(timeout=20)
        self.assertEqual(code, 3, "a deposed leader exits with code 3")
        self.assertIn("no longer the leader", a.logs())
        self.assertNotIn("reply", late, "the paused leader acknowledged a submit")
        self.assertEqual(self.sql("SELECT count(*) FROM jobs"), jobs_now)
        self.assertEqual(self.sql("SELECT count(*) FROM events"), events_now)
        listed = b.jobs.ListJobs(jobs_pb2.ListJobsRequest(page_size=100), timeout=10).jobs
        self.assertEqual(sorted(j.name for j in listed), sorted(acked))
        self.assertEqual(health(b.channel), 1)

    def test_sigterm_hands_over_before_the_lease_expires(self):
        a, b = self.leader_and_standby(lease="10s")
        job = self.submit(a, spec(name="kept"))
        stopped_at = time.monotonic()
        self.assertEqual(a.kill(signal.SIGTERM), 0)
        self.wait_leader(b, timeout=30)
        took = time.monotonic() - stopped_at
        print("hand-over after SIGTERM: %.2fs (lease 10s)" % took, file=sys.stderr)
        self.assertLess(took, 9.0, "the standby waited for the 10 s lease to expire")
        self.assertIn("released the leader lease", a.logs())
        self.assertEqual(self.get(b, job.name).spec.display_name, "kept")

    def test_a_standby_taking_over_cuts_no_call_short(self):
        # Clients hammer the standby while the leader dies: before the
        # takeover every call is refused UNAVAILABLE (naming the leader),
        # after it they are served. None may end CANCELLED: the port is bound
        # once, so nothing is handed over (a standby that shut its own server
        # down at the takeover cancelled the calls racing it).
        a, b = self.leader_and_standby()
        stop = threading.Event()
        outcomes = collections.Counter()
        details = []
        lock = threading.Lock()

        def hammer(i):
            channel = b.open_channel()
            stub = jobs_pb2_grpc.JobsStub(channel)
            n = 0
            while not stop.is_set():
                n += 1
                rid = "hammer-%d-%d" % (i, n)
                try:
                    stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(name=rid), request_id=rid),
                                   timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                    if code != grpc.StatusCode.UNAVAILABLE:
                        with lock:
                            details.append("%s: %s" % (code, e.details()))
                with lock:
                    outcomes[code] += 1
            channel.close()
        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            self.assertEqual(a.kill(signal.SIGKILL), -signal.SIGKILL)
            self.wait_leader(b)
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        self.assertGreater(outcomes[grpc.StatusCode.UNAVAILABLE], 0, dict(outcomes))
        self.assertGreater(outcomes[grpc.StatusCode.OK], 0, dict(outcomes))
        self.assertEqual(set(outcomes) - {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(),
                         "outcomes %s; first others: %s" % (dict(outcomes), details[:5]))

    def test_bad_postgres_flags_are_refused(self):
        env = dict(os.environ)
        env.pop("TALLY_POSTGRES_DSN", None)
        r = subprocess.run([harness.TALLYD, "--store=postgres", "--listen=127.0.0.1:0",
                                    "--metrics_listen=127.0.0.1:0"],
                                   capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 2)
        for way in ("--postgres_dsn", "$TALLY_POSTGRES_DSN", "--postgres_dsn_file"):
            self.assertIn(way, r.stderr + r.stdout)
        r = subprocess.run([harness.TALLYD, "--store=postgres", "--lease_timeout=0s",
                                    "--postgres_dsn=host=x password=s3cret"],
                                   capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--lease_timeout", r.stderr + r.stdout)
        self.assertNotIn("s3cret", r.stderr + r.stdout)


if __name__ == "__main__":
    unittest.main()
