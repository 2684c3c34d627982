"""tallyd's limits from outside: transport limits from --config's grpc_server
section (an oversized header is refused with RESOURCE_EXHAUSTED and tallyd
keeps serving), per-principal submit rates (limits:), the reserved places of
the watch stream limits, and watch streams that announce themselves at once
(initial metadata) while idle."""

import hashlib
import os
import subprocess
import tempfile
import threading
import unittest

import grpc
from harness import TALLYD, Tallyd, experiments_pb2, jobs_pb2, spec

WATCH_ESTABLISHED = "tally-watch-established"


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


class LimitsTest(unittest.TestCase):

    def start_tallyd(self, config="", args=(), token=None):
        d = tempfile.mkdtemp(prefix="tally_it_")
        extra = list(args)
        if config:
            path = os.path.join(d, "tallyd.yaml")
            with open(path, "w") as f:
                f.write(config)
            extra.append("--config=" + path)
        t = Tallyd(d, extra, token=token)
        self.addCleanup(t.stop)
        return t

    def tokens(self, *names):
        """A --auth_tokens file with a user per name (tenant = name); returns
        the flag and the tokens by name."""
        d = tempfile.mkdtemp(prefix="tally_tokens_")
        tokens = {n: "tok-%s-%s" % (n, os.urandom(8).hex()) for n in names}
        path = os.path.join(d, "users.yaml")
        with open(path, "w") as f:
            f.write("principals:\n")
            for n in names:
                f.write('  - {name: %s, tenant: "%s", role: user, token_sha256: "%s"}\n'
                        % (n, n, sha256(tokens[n])))
        return "--auth_tokens=" + path, tokens


class TransportLimitsTest(LimitsTest):

    def test_a_header_over_the_limit_is_refused_and_tallyd_keeps_serving(self):
        # 64 KiB allowed: more than gRPC's own 8 KiB, so an accepted 32 KiB
        # header shows the config reached the server.
        t = self.start_tallyd("grpc_server: {max_metadata_bytes: 65536}\n")
        name = t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10).name
        got = t.jobs.GetJob(jobs_pb2.GetJobRequest(name=name),
                            metadata=[("x-pad", "a" * 32 * 1024)], timeout=10)
        self.assertEqual(got.name, name)
        flood = grpc.insecure_channel(t.grpc_addr,
                                      options=[("grpc.use_local_subchannel_pool", 1)])
        self.addCleanup(flood.close)
        from tally.v1 import jobs_pb2_grpc
        with self.assertRaises(grpc.RpcError) as err:
            jobs_pb2_grpc.JobsStub(flood).GetJob(
                jobs_pb2.GetJobRequest(name=name), metadata=[("x-pad", "a" * 1024 * 1024)],
                timeout=20)
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         err.exception.details())
        self.assertIn("metadata", err.exception.details())
        # The other tenant's connection still serves, and so does a new one
        # (tallyd may close the flooding connection itself).
        self.assertEqual(t.jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10).name,
                         name)
        fresh = grpc.insecure_channel(t.grpc_addr,
                                      options=[("grpc.use_local_subchannel_pool", 1)])
        self.addCleanup(fresh.close)
        self.assertEqual(jobs_pb2_grpc.JobsStub(fresh).GetJob(
            jobs_pb2.GetJobRequest(name=name), timeout=10).name, name)

    def test_a_bad_grpc_server_value_keeps_tallyd_from_starting(self):
        d = tempfile.mkdtemp(prefix="tally_it_")
        path = os.path.join(d, "tallyd.yaml")
        with open(path, "w") as f:
            f.write("grpc_server:\n  max_frame_bytes: 100\n")
        r = subprocess.run([TALLYD, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                            "--data_dir=" + d, "--config=" + path],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr + r.stdout)
        self.assertIn("grpc_server.max_frame_bytes: must be between 16384", r.stderr + r.stdout)


class SubmitRateTest(LimitsTest):

    def test_submits_per_principal_are_refused_past_the_burst(self):
        flag, tokens = self.tokens("alice", "bob")
        # One token every 100 s: the third submit cannot be refilled in time.
        t = self.start_tallyd("limits: {submits_per_second: 0.01, submit_burst: 2}\n",
                              [flag], token=tokens["alice"])
        for _ in range(2):
            t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        with self.assertRaises(grpc.RpcError) as err:
            t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        details = err.exception.details()
        self.assertIn("alice is over its limit", details)
        self.assertIn("limits.submits_per_second", details)
        self.assertIn("retry in", details)
        # CreateExperiment takes from the same bucket.
        with self.assertRaises(grpc.RpcError) as err:
            t.experiments.CreateExperiment(experiments_pb2.CreateExperimentRequest(
                spec=experiments_pb2.ExperimentSpec()), timeout=10)
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # Another principal has its own bucket, and reads are not limited.
        bob = t.open_channel(token=tokens["bob"])
        self.addCleanup(bob.close)
        from tally.v1 import jobs_pb2_grpc
        job = jobs_pb2_grpc.JobsStub(bob).SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()),
                                                    timeout=10)
        self.assertEqual(t.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10).jobs[0].tenant,
                         "alice")
        self.assertEqual(job.tenant, "bob")


class StreamReserveTest(LimitsTest):

    def test_principals_at_their_limit_leave_room_for_others(self):
        # 4 in all, the last 2 kept for callers holding none, 3 per caller.
        names = ("a1", "a2", "a3", "a4")
        flag, tokens = self.tokens(*names)
        t = self.start_tallyd(args=[flag, "--max_watch_streams=4",
                                    "--max_watch_streams_per_principal=3",
                                    "--watch_streams_reserved=2"])
        from tally.v1 import jobs_pb2_grpc
        stubs, jobs = {}, {}
        for n in names:
            ch = t.open_channel(token=tokens[n])
            self.addCleanup(ch.close)
            stubs[n] = jobs_pb2_grpc.JobsStub(ch)
            jobs[n] = stubs[n].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()),
                                         timeout=10).name
        open_streams = []

        def watch(n):
            s = stubs[n].WatchJob(jobs_pb2.WatchJobRequest(name=jobs[n]), timeout=60)
            self.addCleanup(s.cancel)
            next(s)  # open and counted
            open_streams.append(s)

        def refused(n):
            with self.assertRaises(grpc.RpcError) as err:
                watch(n)
            self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            return err.exception.details()

        watch("a1")
        watch("a1")
        self.assertIn("--watch_streams_reserved", refused("a1"))  # below its own 3
        watch("a2")  # holds none: a reserved place
        self.assertIn("--watch_streams_reserved", refused("a2"))
        watch("a3")
        self.assertIn("--max_watch_streams=4", refused("a4"))
        # A closed stream's place is free again.
        open_streams[0].cancel()
        from harness import wait_for

        def a4_admitted():
            try:
                watch("a4")
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                return False

        wait_for(a4_admitted, timeout=10, interval=0.1, what="a closed stream's place")


class WatchEstablishedTest(LimitsTest):

    def initial_metadata(self, call):
        """The call's initial metadata, waited for on a thread: an idle watch
        must send it without any event to carry it."""
        got = {}
        th = threading.Thread(target=lambda: got.update(md=dict(call.initial_metadata())),
                              daemon=True)
        th.start()
        th.join(timeout=10)
        call.cancel()
        self.assertIn("md", got, "no initial metadata within 10 s on an idle watch")
        return got["md"]

    def test_idle_job_and_experiment_watches_send_initial_metadata_at_once(self):
        t = self.start_tallyd()
        job = t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        # Past the last event: nothing to send until the job changes.
        call = t.jobs.WatchJob(jobs_pb2.WatchJobRequest(
            name=job.name, after_sequence=job.last_event_sequence), timeout=60)
        self.assertEqual(self.initial_metadata(call).get(WATCH_ESTABLISHED), "1")

        es = experiments_pb2.ExperimentSpec()
        es.base.CopyFrom(spec(max_steps=10))
        es.base.resources.gpu_type = "never"  # stays queued: no events flow
        es.target.val_loss = 1.0
        es.variants.add(name="a")
        exp = t.experiments.CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=es), timeout=10)
        call = t.experiments.WatchExperiment(experiments_pb2.WatchExperimentRequest(
            name=exp.name, after_sequence=exp.last_event_sequence), timeout=60)
        self.assertEqual(self.initial_metadata(call).get(WATCH_ESTABLISHED), "1")


class DataRootsEchoTest(LimitsTest):

    def test_refusals_name_what_was_sent_and_never_tallyds_paths(self):
        root = tempfile.mkdtemp(prefix="tally_root_")
        t = self.start_tallyd(args=["--data_roots=" + root])
        cwd = os.getcwd()  # tallyd's working directory too
        for path, hidden in (("/proc/self/cwd/corpus", cwd), ("/proc/self/exe", TALLYD),
                             ("/proc/self/root" + root + "/../x", os.path.dirname(root) + "/x")):
            s = spec()
            s.data.train_path = path
            with self.assertRaises(grpc.RpcError) as err:
                t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=s), timeout=10)
            self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            details = err.exception.details()
            self.assertIn('spec.data.train_path "%s" is outside tallyd\'s --data_roots (%s)'
                          % (path, root), details)
            self.assertNotIn(hidden, details.replace(path, ""))
            self.assertNotIn("resolves to", details)


class FullDiskReadinessTest(LimitsTest):
    """/readyz on a full disk: the store's folder on a small tmpfs (needs
    root to mount it; skipped otherwise)."""

    def mount_small_disk(self):
        mnt = tempfile.mkdtemp(prefix="tally_disk_")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs here: " + (r.stderr or r.stdout).strip())
        self.addCleanup(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
        return mnt

    def fill(self, path):
        with open(path, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass

    def readyz(self, t):
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen("http://%s/readyz" % t.metrics_addr, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def test_readyz_is_not_ready_while_writes_fail_and_recovers(self):
        from harness import wait_for
        mnt = self.mount_small_disk()
        t = self.start_tallyd(args=["--data_dir=" + mnt])
        t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        self.assertEqual(self.readyz(t)[0], 200)
        filler = os.path.join(mnt, "filler")
        self.fill(filler)
        with self.assertRaises(grpc.RpcError) as err:
            for _ in range(50):  # until the pages SQLite had run out
                t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        self.assertIn(err.exception.code(), (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                             grpc.StatusCode.INTERNAL,
                                             grpc.StatusCode.UNAVAILABLE))
        status, body = self.readyz(t)
        self.assertEqual(status, 503, "%s; the refused submit: %s\n%s"
                         % (body, err.exception.details(), t.logs()[-3000:]))
        self.assertIn("not ready: the store refuses writes", body)
        # Reads still answer while writes fail.
        self.assertTrue(t.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10).jobs)
        os.unlink(filler)
        wait_for(lambda: self.readyz(t)[0] == 200, timeout=15, interval=0.1,
                 what="/readyz to recover once the disk has room")
        t.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)


if __name__ == "__main__":
    unittest.main()
