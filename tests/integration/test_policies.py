"""tallyd's policies with real processes: early stopping on validation-loss
patience, budgets, dollars that match GPU-seconds x price, and both carrying
on across a tallyd restart."""

import os
import signal
import subprocess
import time
import unittest

from harness import BUILD, ClusterTest, jobs_pb2, spec, wait_for

PRICE = 36.0  # $/GPU-hour for "cpu" in these tests: $0.01 a second


def seconds(start, end):
    return (end.seconds + end.nanos / 1e9) - (start.seconds + start.nanos / 1e9)


class PoliciesTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: %g}\nflops_per_second_per_gpu: {cpu: 1.0e10}\n"
                    % PRICE)
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()

    def learning_spec(self, max_steps, name):
        s = spec(max_steps=max_steps, name=name, checkpoint_interval=25)
        s.training.eval_interval_steps = 25
        s.training.eval_tokens = 4096
        s.optimizer.lr = 1e-2
        s.optimizer.min_lr = 1e-2
        s.optimizer.warmup_steps = 5
        return s

    def test_a_plateau_is_stopped_early_with_the_rule_and_best_checkpoint(self):
        self.add_worker("w1")
        s = self.learning_spec(20000, "plateau")
        s.early_stopping.patience = 3  # an improvement is 3% better than the best
        job = self.submit(s)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_EARLY_STOPPED,
                                          jobs_pb2.JOB_STATE_SUCCEEDED,
                                          jobs_pb2.JOB_STATE_FAILED}, timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_EARLY_STOPPED, done.state_reason)
        self.assertIn("patience: 3 evaluations without improving", done.state_reason)
        self.assertLess(done.step, 20000)
        es = done.early_stopping
        self.assertEqual(es.stop_rule, "patience")
        self.assertTrue(os.path.exists(es.best_checkpoint), es.best_checkpoint)
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        lowest = min((c for c in cks if c.val_loss > 0), key=lambda c: c.val_loss)
        self.assertEqual(es.best_checkpoint, lowest.path, "the lowest validation loss")
        events = self.events(job.name)
        stopping = [e.sequence for e in events if e.type == "stopping"]
        self.assertEqual(len(stopping), 1, "one stop decision")
        # The stop checkpoint's own evaluation comes after the decision and is not
        # counted by the rule: judge the three evaluations that decided it.
        evals = [e for e in events if e.type == "eval" and e.sequence < stopping[0]]
        for e in evals[-3:]:
            self.assertGreaterEqual(e.val_loss, es.best_val_loss * 0.97)
        print("\nearly stopped at step %d: best val loss %.4f at step %d (%d evals); $%.4f"
              % (done.step, es.best_val_loss, es.best_step, len(evals), done.cost.cost_usd))

    def test_a_target_stop_succeeds_and_keeps_a_checkpoint_of_that_state(self):
        self.add_worker("w1")
        s = self.learning_spec(20000, "target")
        s.training.checkpoint_interval_steps = 100000  # only the stop writes one
        s.early_stopping.target_rel_to_baseline = 0.85
        job = self.submit(s)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_EARLY_STOPPED,
                                          jobs_pb2.JOB_STATE_SUCCEEDED,
                                          jobs_pb2.JOB_STATE_FAILED}, timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertIn("target reached", done.state_reason)
        t = done.target_reached
        self.assertGreater(t.step, 0)
        self.assertLess(done.step, 20000)
        self.assertAlmostEqual(done.target_val_loss, 0.85 * done.early_stopping.baseline_val_loss,
                               places=9)
        self.assertLessEqual(t.val_loss, done.target_val_loss)
        self.assertLessEqual(t.cost_to_target_usd, t.cost_usd + 1e-12)
        self.assertLessEqual(t.tokens_to_target, t.tokens)
        self.assertGreater(t.cost_to_target_usd, 0)
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertEqual(len(cks), 1, "the stop's checkpoint, and no other")
        ck = cks[0]
        self.assertGreaterEqual(ck.step, t.step)
        self.assertGreater(ck.val_loss, 0, "the stopped state was evaluated")
        with open(ck.path, "rb") as f:
            import hashlib
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), ck.sha256)
        self.assertEqual(done.early_stopping.best_checkpoint, ck.path)
        types = [e.type for e in self.events(job.name)]
        self.assertLess(types.index("target_reached"), types.index("stopping"))
        self.assertLess(types.index("stopping"), types.index("checkpoint"))
        print("\ntarget %.4f reached at step %d ($%.4f; $%.4f to the target itself); "
              "checkpoint at step %d" % (done.target_val_loss, t.step, t.cost_usd,
                                         t.cost_to_target_usd, ck.step))

    def test_a_target_of_the_quantized_loss_is_judged_by_it(self):
        # Evaluated quantized (q8_0, the feed-forward weights) and judged by
        # that loss: the target is a fraction of the step-0 quantized loss,
        # and every evaluation, checkpoint and the job carry both losses.
        self.add_worker("w1")
        s = self.learning_spec(20000, "quantized-target")
        s.model.d_model = 32
        s.training.eval_quantized = "q8_0"
        s.early_stopping.metric = "quantized_val_loss"
        s.early_stopping.target_rel_to_baseline = 0.85
        job = self.submit(s)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_EARLY_STOPPED,
                                          jobs_pb2.JOB_STATE_SUCCEEDED,
                                          jobs_pb2.JOB_STATE_FAILED}, timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertIn("target reached: quantized_val_loss", done.state_reason)
        es = done.early_stopping
        self.assertEqual(es.metric, "quantized_val_loss")
        self.assertTrue(done.HasField("quantized_val_loss"))
        t = done.target_reached
        self.assertEqual(t.metric, "quantized_val_loss")
        self.assertTrue(t.HasField("quantized_val_loss"))
        self.assertLessEqual(t.quantized_val_loss, done.target_val_loss)
        step0 = done.curve[0]
        self.assertEqual(step0.step, 0)
        self.assertAlmostEqual(es.baseline_val_loss, step0.quantized_val_loss, places=12,
                               msg="the baseline is the step-0 quantized loss")
        self.assertAlmostEqual(done.target_val_loss, 0.85 * step0.quantized_val_loss, places=9)
        self.assertTrue(all(p.HasField("quantized_val_loss") for p in done.curve))
        evals = [e for e in self.events(job.name) if e.type == "eval"]
        self.assertTrue(evals and all(e.HasField("quantized_val_loss") for e in evals))
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertTrue(cks and all(c.HasField("quantized_val_loss") for c in cks))
        lowest = min(cks, key=lambda c: c.quantized_val_loss)
        self.assertEqual(es.best_checkpoint, lowest.path, "the lowest quantized loss")
        out = self.tallyctl("checkpoints", job.name)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(" Q8_0 ", out.stdout.splitlines()[0])
        best = [l for l in out.stdout.splitlines() if l.startswith("*")]
        self.assertEqual(len(best), 1, out.stdout)
        self.assertIn(lowest.path, best[0])
        self.assertIn("the lowest quantized_val_loss", out.stdout)
        # tally-export --job picks the same best checkpoint, and exports the
        # GGUF file of the format the job was evaluated in.
        gguf = os.path.join(self.dir, "best.gguf")
        exported = subprocess.run(
            [os.path.join(BUILD, "worker", "tally-export"), "--job=" + job.name,
             "--which=best", "--format=gguf", "--quant=q8_0", "--out=" + gguf],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, TALLY_CONTROLLER=self.tallyd.grpc_addr))
        self.assertEqual(exported.returncode, 0, exported.stderr)
        self.assertIn(lowest.path, exported.stderr)
        self.assertIn("quantized val loss", exported.stderr)
        self.assertTrue(os.path.getsize(gguf) > 0)
        print("\nquantized target %.4f reached at step %d (val_loss %.4f, quantized %.4f)"
              % (done.target_val_loss, t.step, t.val_loss, t.quantized_val_loss))

    def test_budget_stops_within_one_progress_interval(self):
        self.add_worker("w1")
        s = spec(max_steps=1000000, name="budget")
        s.budget.max_dollars = 0.02  # two seconds at $0.01/s
        job = self.submit(s)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED,
                                          jobs_pb2.JOB_STATE_FAILED}, timeout=120)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED, done.state_reason)
        self.assertIn("budget: spent $0.02", done.state_reason)
        overshoot = done.cost.cost_usd - 0.02
        self.assertGreaterEqual(overshoot, 0)
        # Progress arrives every step; one progress interval (1 s) costs $0.01.
        self.assertLess(overshoot, 0.01, "stopped within one progress interval")
        self.assertEqual(done.cost.usd_per_gpu_hour, PRICE)

    def test_dollars_are_gpu_seconds_times_price(self):
        self.add_worker("w1")
        s = self.learning_spec(300, "priced")
        job = self.submit(s)
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        held = seconds(done.start_time, done.end_time)
        self.assertGreater(held, 0.2)
        expected = held * PRICE / 3600
        self.assertAlmostEqual(done.cost.cost_usd / expected, 1.0, delta=0.01)
        self.assertAlmostEqual(done.cost.gpu_seconds / held, 1.0, delta=0.01)
        # Checkpoints carry cumulative dollars and dollars since the previous one.
        cks = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertEqual(len(cks), 12)
        total, tokens = 0, 0
        for c in cks:
            total += c.cost_since_previous_usd
            self.assertAlmostEqual(c.cost_usd, total, places=9)
            self.assertEqual(c.tokens_since_previous, c.tokens - tokens)
            tokens = c.tokens
            self.assertGreater(c.val_loss, 0)
        self.assertGreater(cks[0].usd_per_val_loss_improvement, 0)
        # The estimate stands beside the actual.
        self.assertGreater(done.cost.estimate.cost_usd, 0)
        self.assertEqual(done.cost.estimate.throughput_source, "configured")
        r = self.tallyctl("cost", job.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("estimate:", r.stdout)
        self.assertIn("actual:", r.stdout)
        self.assertIn("USD_PER_GAIN", r.stdout)
        # Finished jobs measure throughput for the next estimate.
        est = self.tallyd.jobs.EstimateCost(jobs_pb2.EstimateCostRequest(spec=s), timeout=10)
        self.assertEqual(est.throughput_source, "measured from 1 finished cpu jobs")

    def test_sighup_reloads_prices_and_a_bad_file_keeps_them(self):
        s = spec(max_steps=10, name="priced")
        est = lambda: self.tallyd.jobs.EstimateCost(
            jobs_pb2.EstimateCostRequest(spec=s), timeout=10)
        self.assertEqual(est().usd_per_gpu_hour, PRICE)
        config = self.tallyd.extra_args[0].split("=", 1)[1]
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: 72}\n")
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: est().usd_per_gpu_hour == 72, timeout=10, what="the new price")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: cheap}\n")
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "keeping the previous prices" in self.tallyd.logs(), timeout=10,
                 what="the reload to be refused")
        self.assertEqual(est().usd_per_gpu_hour, 72)
        self.assertIn("usd_per_gpu_hour.cpu (line 1): not a number", self.tallyd.logs())

    def test_patience_and_cost_continue_across_a_tallyd_restart(self):
        self.add_worker("w1")
        s = self.learning_spec(4000, "restart")
        s.early_stopping.patience = 1000  # counts, never stops
        job = self.submit(s)
        wait_for(lambda: self.get(job.name).early_stopping.evals >= 3, timeout=120,
                 what="three evaluations")
        before = self.get(job.name)
        self.assertEqual(self.tallyd.kill(signal.SIGKILL), -signal.SIGKILL)
        time.sleep(0.3)  # the worker trains on, unheard
        self.tallyd.start()
        after = self.get(job.name)
        self.assertGreaterEqual(after.early_stopping.evals, before.early_stopping.evals)
        self.assertEqual(after.early_stopping.baseline_val_loss,
                         before.early_stopping.baseline_val_loss)
        self.assertGreaterEqual(after.cost.cost_usd, before.cost.cost_usd,
                                "cost resumes where it was")
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=300)
        self.assertEqual(done.attempt, 1, "re-adopted, not redone: %s" % [
            (e.type, e.reason) for e in self.events(job.name) if e.type not in ("progress", "eval")])
        evals = [e for e in self.events(job.name) if e.type == "eval"]
        self.assertEqual(done.early_stopping.evals, len({e.step for e in evals}))
        self.assertEqual(done.early_stopping.evals, 4000 // 25 + 1)
        # GPUs were held while tallyd was down: that time is paid for too.
        held = seconds(done.start_time, done.end_time)
        self.assertAlmostEqual(done.cost.cost_usd / (held * PRICE / 3600), 1.0, delta=0.01)


if __name__ == "__main__":
    unittest.main()
