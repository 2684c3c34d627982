"""Workers that scale to zero, with real tallyd and tally-worker processes on
CPU: tallyd's /metrics says how many GPUs are wanted per GPU type
(tally_gpus_wanted: queued jobs that could run plus running ones) and how
many workers sit idle (tally_workers_idle), which is what an autoscaler
(deploy/k8s/components/keda) sizes the fleet by; and a worker started with
--exit_when_idle=2s runs a job to its end, then leaves about 2 s later,
exiting 0 after telling tallyd (a notice, cause idle), never while the job
runs."""

import subprocess
import time
import unittest

from harness import WORKER, ClusterTest, jobs_pb2, spec, wait_for

IDLE_SECONDS = 2.0


class ScaleTest(ClusterTest):

    def wait_gauges(self, wanted, idle, what):
        """Waits (tallyd refreshes its gauges every tick) until
        tally_gpus_wanted and tally_workers_idle for cpu read these values."""
        return wait_for(
            lambda: (self.metric("tally_gpus_wanted", gpu_type="cpu"),
                     self.metric("tally_workers_idle", gpu_type="cpu")) == (wanted, idle),
            timeout=10, interval=0.05,
            what="%s: tally_gpus_wanted %s and tally_workers_idle %s (now %s, %s)" % (
                what, wanted, idle, self.metric("tally_gpus_wanted", gpu_type="cpu"),
                self.metric("tally_workers_idle", gpu_type="cpu")))

    def test_an_idle_worker_exits_after_its_job_not_during_it(self):
        # Demand before any worker exists: what scales a fleet up from zero.
        long_job = self.submit(spec(max_steps=1000000, name="long"))
        self.wait_gauges(1, 0, "a queued job and no worker")

        w = self.add_worker("w1", ["--exit_when_idle=%gs" % IDLE_SECONDS])
        self.wait_state(long_job.name, jobs_pb2.JOB_STATE_RUNNING)
        started = time.monotonic()
        self.wait_gauges(1, 0, "the job running on the only worker")
        short = self.submit(spec(max_steps=50, name="short"))
        self.wait_gauges(2, 0, "one job running, one queued behind it")
        # Well past the idle timeout with a job running: the worker stays.
        wait_for(lambda: time.monotonic() - started > IDLE_SECONDS + 1.5, timeout=10)
        self.assertEqual(self.get(long_job.name).state, jobs_pb2.JOB_STATE_RUNNING)
        self.assertIsNone(w.proc.poll(), "the worker left while its job ran")

        # The short job runs to its end on the same worker; then the worker
        # is idle, and leaves about IDLE_SECONDS later.
        self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=long_job.name, reason="done"),
                                   timeout=10)
        self.wait_state(short.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=120)
        finished = time.monotonic()
        self.assertIsNone(w.proc.poll(), "the worker left right after its job")
        self.wait_gauges(0, 1, "the jobs done, the worker idle")

        code = w.proc.wait(timeout=30)
        left = time.monotonic() - finished
        self.assertEqual(code, 0, "tally-worker exits 0 when it leaves idle")
        self.assertGreaterEqual(left, IDLE_SECONDS - 0.5)
        self.assertLess(left, IDLE_SECONDS + 5)
        self.wait_gauges(0, 0, "the worker gone")
        self.assertEqual(self.metric("tally_workers", gpu_type="cpu", state="disconnected"), 1)
        self.assertEqual(self.get(short.name).attempt, 1, "one attempt: nothing was preempted")
        self.assertEqual(self.get(short.name).worker_ids, ["w1"])
        with open(w.log_path) as f:
            log = f.read()
        self.assertIn("(--exit_when_idle): leaving", log)
        self.assertIn("going away (idle)", log)
        print("\na job ran %.1f s, past a %.0f s idle timeout; the worker left %.2f s after the "
              "next one ended" % (finished - started, IDLE_SECONDS, left))

    def test_a_worker_that_never_gets_work_leaves_and_a_new_job_is_wanted_again(self):
        w = self.add_worker("w1", ["--exit_when_idle=%gs" % IDLE_SECONDS])
        self.wait_gauges(0, 1, "a connected worker with nothing to do")
        self.assertEqual(w.proc.wait(timeout=30), 0)
        self.wait_gauges(0, 0, "the idle worker gone")
        # tallyd placed nothing on it while it left; a job now waits for a
        # worker, and says so in the demand.
        job = self.submit(spec(max_steps=20, name="after"))
        self.wait_gauges(1, 0, "a job queued after the fleet went to zero")
        self.assertEqual(self.get(job.name).state, jobs_pb2.JOB_STATE_QUEUED)
        self.add_worker("w2")
        self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=120)

    def test_a_bad_idle_duration_is_refused_naming_the_flag(self):
        for value in ("5", "-1s", "soon"):
            r = subprocess.run([WORKER, "--controller=127.0.0.1:1", "--exit_when_idle=" + value],
                               capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, value)
            self.assertIn("--exit_when_idle: must be a duration of 0 or more with its unit, "
                          "such as 90s", r.stdout + r.stderr, value)
            self.assertEqual(r.returncode, 2, value)


if __name__ == "__main__":
    unittest.main()
