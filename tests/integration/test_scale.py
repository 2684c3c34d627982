"""Workers that scale to zero, with real tallyd and tally-worker processes on
CPU: tallyd's /metrics says how many GPUs are wanted per GPU type
(tally_gpus_wanted: queued jobs that could run plus running ones) and how
many workers sit idle (tally_workers_idle), which is what an autoscaler
(deploy/k8s/components/keda) sizes the fleet by; and a worker started with
--exit_when_idle=2s runs a job to its end, then leaves about 2 s later,
exiting 0 after telling tallyd (a notice, cause idle), never while the job
runs. A worker that leaves cleanly (SIGTERM idle or running, or
--exit_when_idle) is counted in tally_worker_exits_total by cause, never in
tally_workers_lost_total, which counts only a worker whose stream broke or
that went silent (SIGKILL)."""

import signal
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

    def test_clean_exits_are_counted_by_cause_and_only_a_killed_worker_is_lost(self):
        def exits(cause):
            return self.metric("tally_worker_exits_total", gpu_type="cpu", cause=cause)

        def lost():
            return self.metric("tally_workers_lost_total", gpu_type="cpu")

        # Scale to zero: an idle worker with --exit_when_idle leaves.
        idle = self.add_worker("idle", ["--exit_when_idle=%gs" % IDLE_SECONDS])
        self.assertEqual(idle.proc.wait(timeout=30), 0)
        wait_for(lambda: exits("idle") == 1, timeout=10, what="an idle exit counted")
        # A scale-down: SIGTERM of an idle worker.
        calm = self.add_worker("calm")
        self.wait_gauges(0, 1, "the idle worker connected")
        self.assertEqual(calm.kill(signal.SIGTERM), 0)
        wait_for(lambda: exits("sigterm") == 1, timeout=10, what="a SIGTERM exit counted")
        # A preemption: SIGTERM of a worker running a job, which checkpoints,
        # hands the attempt back and leaves.
        busy = self.add_worker("busy")
        job = self.submit(spec(max_steps=1000000, name="preempted"))
        self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        self.assertEqual(busy.kill(signal.SIGTERM), 0)
        self.wait_state(job.name, jobs_pb2.JOB_STATE_QUEUED)
        wait_for(lambda: exits("sigterm") == 2, timeout=10, what="a preempted worker's exit")
        # A real loss: a worker killed with its job running.
        doomed = self.add_worker("doomed")
        self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        doomed.kill(signal.SIGKILL)
        wait_for(lambda: lost() == 1, timeout=15, what="the killed worker counted lost")
        # The killed worker was found silent past tallyd's heartbeat timeout
        # (3 s), after every clean one had left: they were not counted lost.
        self.assertEqual(lost(), 1)
        self.assertEqual((exits("idle"), exits("sigterm"), exits("notice_file")), (1, 2, 0))

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
