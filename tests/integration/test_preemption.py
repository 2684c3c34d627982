"""Preemption without lost work, with real tallyd and tally-worker processes
on CPU: a worker that gets SIGTERM (or finds its notice file) checkpoints the
step it is on, reports the attempt PREEMPTED and exits 0; the job requeues at
once without using up an attempt and resumes from that checkpoint, redoing
nothing, so its validation curve is the one an uninterrupted run draws. A
rank of a 2-rank job gets the notice and the whole gang checkpoints and
requeues. A high-priority job preempts a low-priority one on a full fleet and
both finish. A notice checkpoint that cannot finish within the deadline falls
back to the previous checkpoint. Spot workers are priced at the spot price."""

import os
import re
import signal
import time
import unittest

import grpc
from google.protobuf import json_format
from harness import ClusterTest, Tallyd, jobs_pb2, spec, wait_for

RESUME_RE = re.compile(r"resuming from step (\d+)")


def long_spec(name, max_steps=2500, priority=0, checkpoint_interval=0, gpu_count=1):
    s = spec(max_steps=max_steps, name=name, priority=priority,
             checkpoint_interval=checkpoint_interval, gpu_count=gpu_count)
    s.training.eval_interval_steps = 50
    s.training.eval_tokens = 2048
    if gpu_count > 1:
        s.training.micro_batch_rows = 2
        s.training.global_batch_tokens = 2 * 64 * gpu_count
    return s


class PreemptionTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: 36.0}\n")  # $0.01 a GPU-second
        # Priority preemption may take an attempt that has run a moment.
        self.tallyd.stop()
        self.tallyd = Tallyd(self.dir, extra_args=["--min_runtime_before_preemption=1s",
                                                   "--config=" + config])

    def events(self, name, after=0):
        """The job's events so far (a watch of a job still going does not end)."""
        out = []
        stream = self.tallyd.jobs.WatchJob(
            jobs_pb2.WatchJobRequest(name=name, after_sequence=after), timeout=3)
        try:
            for e in stream:
                out.append(e)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        return out

    def wait_step(self, name, step, timeout=120):
        return wait_for(lambda: self.get(name).step >= step or None, timeout=timeout,
                        what="%s to pass step %d" % (name, step))

    def curve(self, name):
        return [(p.step, p.val_loss) for p in self.get(name).curve]

    def started_steps(self, name):
        return [int(m.group(1)) if m else 0
                for m in (RESUME_RE.search(e.detail) for e in self.events(name)
                          if e.type == "started")]

    def assert_same_curve(self, got, want):
        """The preempted job's evaluations are the uninterrupted run's, step
        for step (the same model state at every evaluation)."""
        self.assertEqual([s for s, _ in got], [s for s, _ in want])
        for (step, a), (_, b) in zip(got, want):
            self.assertAlmostEqual(a, b, delta=1e-6 * abs(b), msg="val_loss at step %d" % step)

    def reference_curve(self, s):
        """The same spec run once without interruption."""
        s.display_name += "-reference"
        ref = self.submit(s)
        self.wait_state(ref.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        return self.curve(ref.name)

    def test_sigterm_mid_job_resumes_from_the_notice_checkpoint(self):
        w1 = self.add_worker("w1")
        s = long_spec("noticed", max_steps=1500)
        s.max_attempts = 1  # a preemption must not use it up
        job = self.submit(s)
        self.wait_step(job.name, 300)
        started = time.monotonic()
        self.assertEqual(w1.kill(signal.SIGTERM), 0, "tally-worker exits 0 after a notice")
        exit_seconds = time.monotonic() - started
        self.assertLess(exit_seconds, 25.0)
        j = self.wait_state(job.name, jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(j.preemption.count, 1)
        self.assertEqual(j.preemption.by_notice, 1)
        self.assertEqual(j.cost.redone_usd, 0.0, "the notice checkpoint landed")
        self.assertIn("preempted (sigterm)", j.state_reason)
        types = [e.type for e in self.events(job.name)]
        self.assertIn("notice", types)
        self.assertIn("preempted", types)
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertEqual(len(cks), 1, "only the notice checkpoint (no interval checkpoints)")
        stopped_at = cks[-1].step
        self.assertGreaterEqual(stopped_at, 300)
        self.assertEqual(self.metric("tally_preemptions_total", cause="sigterm",
                                     gpu_type="cpu"), 1)

        self.add_worker("w2")
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        # Recomputed steps: none. The second attempt resumed at the very step
        # the first stopped at, and nothing was charged as redone.
        self.assertEqual(self.started_steps(job.name), [0, stopped_at])
        self.assertEqual(done.cost.redone_usd, 0.0)
        self.assertEqual(done.cost.lost_usd, 0.0)
        self.assertEqual(done.attempt, 2)
        preempted_curve = self.curve(job.name)
        self.assert_same_curve(preempted_curve,
                               self.reference_curve(long_spec("noticed", max_steps=1500)))
        print("\nSIGTERM at step %d: worker exited 0 in %.2f s; resumed at step %d, "
              "%d evaluations identical to an uninterrupted run"
              % (stopped_at, exit_seconds, stopped_at, len(preempted_curve)))

    def test_a_notice_file_preempts_like_sigterm(self):
        notice = os.path.join(self.dir, "notice")
        w1 = self.add_worker("w1", ["--preemption_notice_file=" + notice])
        job = self.submit(long_spec("file", max_steps=100000))
        self.wait_step(job.name, 100)
        open(notice, "w").close()
        self.assertEqual(w1.proc.wait(timeout=30), 0)
        j = self.wait_state(job.name, jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(j.preemption.by_notice, 1)
        self.assertIn("preempted (notice_file)", j.state_reason)
        self.assertEqual(j.cost.redone_usd, 0.0)
        self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name), timeout=10)

    def test_a_rank_of_a_two_rank_job_gets_the_notice(self):
        workers = {w: self.add_worker(w) for w in ("w1", "w2")}
        s = long_spec("gang", max_steps=1200, gpu_count=2)
        job = self.submit(s)
        running = self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING, timeout=60)
        first = list(running.worker_ids)
        self.wait_step(job.name, 150)
        # Rank 1's worker is evicted; rank 0 (on a healthy worker) writes the
        # checkpoint of the step they finish together.
        self.assertEqual(workers[first[1]].kill(signal.SIGTERM), 0)
        j = wait_for(lambda: (lambda j: j if j.preemption.count == 1 else None)(self.get(job.name)),
                     timeout=60, what="the gang's preemption")
        self.assertEqual(j.cost.redone_usd, 0.0)
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        steps = self.started_steps(job.name)
        self.assertEqual(len(steps), 2)
        self.assertGreaterEqual(steps[1], 150)
        self.assertEqual(done.cost.lost_usd, 0.0)
        # One worker is left: the job resumed on it alone (its two
        # micro-batches a step allow one rank) rather than wait for a second.
        self.assertEqual(list(done.worker_ids), [first[0]])
        started = [e.detail for e in self.events(job.name) if e.type == "started"]
        self.assertIn("world size 1 of 2", started[-1])

    def test_a_high_priority_job_preempts_a_low_priority_one_on_a_full_fleet(self):
        self.add_worker("w1")
        low_spec = long_spec("low", max_steps=1500, priority=-10)
        low = self.submit(low_spec)
        self.wait_step(low.name, 200)
        high = self.submit(long_spec("high", max_steps=300, priority=50))
        self.wait_state(high.name, jobs_pb2.JOB_STATE_RUNNING, timeout=60)
        l = self.get(low.name)
        self.assertEqual(l.state, jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(l.preemption.by_priority, 1)
        self.assertEqual(list(l.preemption.preempted_by), [high.name])
        self.assertEqual(l.cost.redone_usd, 0.0, "the preemption checkpoint landed")
        self.wait_state(high.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        done = self.wait_state(low.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        self.assertEqual(done.preemption.count, 1)
        steps = self.started_steps(low.name)
        self.assertEqual(len(steps), 2)
        types = [e.type for e in self.events(low.name)]
        self.assertIn("preempting", types)
        self.assertIn("preempted", types)
        self.assertEqual(self.metric("tally_preemptions_total", cause="priority",
                                     gpu_type="cpu"), 1)
        self.assert_same_curve(self.curve(low.name),
                               self.reference_curve(long_spec("low", max_steps=1500,
                                                              priority=-10)))

    def test_a_notice_checkpoint_that_cannot_finish_in_time_falls_back(self):
        w1 = self.add_worker("w1", ["--preemption_deadline=2s",
                                    "--testonly_preempt_checkpoint_delay=60s"])
        job = self.submit(long_spec("slow", max_steps=100000, checkpoint_interval=100))
        wait_for(lambda: len(self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints) >= 1,
            timeout=120, what="an interval checkpoint")
        self.wait_step(job.name, 150)
        started = time.monotonic()
        self.assertEqual(w1.kill(signal.SIGTERM), 0)
        self.assertLess(time.monotonic() - started, 10.0, "the deadline bounds the exit")
        j = self.wait_state(job.name, jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(j.preemption.by_notice, 1)
        self.assertGreater(j.cost.redone_usd, 0.0, "steps after the last checkpoint are redone")
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertEqual(cks[-1].step % 100, 0, "no notice checkpoint was recorded")
        with open(w1.log_path) as f:
            self.assertIn("did not finish within", f.read())
        self.add_worker("w2")
        running = self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING, timeout=60)
        self.assertEqual(self.started_steps(job.name)[-1], cks[-1].step,
                         "resumed from the previous checkpoint")
        self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=running.name), timeout=10)


class SpotPricingTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: 36.0}\n"
                    "spot_usd_per_gpu_hour: {cpu: 3.6}\n"
                    "flops_per_second_per_gpu: {cpu: 2.0e10}\n")
        self.tallyd.stop()
        self.tallyd = Tallyd(self.dir, extra_args=["--config=" + config])

    def test_spot_workers_are_priced_at_the_spot_price_and_matched_by_capacity(self):
        self.add_worker("spot1", ["--capacity=spot"])
        od_spec = long_spec("on-demand-only", max_steps=50)
        od_spec.resources.capacity = "on_demand"
        od = self.submit(od_spec)
        job = self.submit(long_spec("any", max_steps=600))
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        self.assertEqual(done.cost.usd_per_gpu_hour, 3.6)
        self.assertGreater(done.cost.spot_gpu_seconds, 0)
        self.assertAlmostEqual(done.cost.cost_usd, done.cost.gpu_seconds * 3.6 / 3600,
                               delta=1e-9 + 1e-6 * done.cost.cost_usd)
        self.assertEqual(self.get(od.name).state, jobs_pb2.JOB_STATE_QUEUED,
                         "an on-demand job never runs on a spot worker")
        self.add_worker("od1", ["--capacity=on_demand"])
        od_done = self.wait_state(od.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=120)
        self.assertEqual(od_done.cost.usd_per_gpu_hour, 36.0)
        est = self.tallyd.jobs.EstimateCost(
            jobs_pb2.EstimateCostRequest(spec=long_spec("estimate", max_steps=1000)), timeout=10)
        self.assertEqual(est.usd_per_gpu_hour, 36.0)
        self.assertEqual(est.spot_usd_per_gpu_hour, 3.6)
        self.assertGreater(est.spot_savings_usd, 0)
        self.assertLess(est.spot_cost_usd, est.cost_usd)
        path = os.path.join(self.dir, "estimate.json")
        with open(path, "w") as f:
            f.write(json_format.MessageToJson(long_spec("estimate", max_steps=1000),
                                              preserving_proto_field_name=True))
        out = self.tallyctl("estimate", "-f", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("spot", out.stdout)


if __name__ == "__main__":
    unittest.main()
