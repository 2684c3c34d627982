"""Real training through tallyd: a tally-worker trains a small model on the
corpus until its validation loss is clearly below the unigram baseline, with
its evaluations and checkpoints recorded in tallyd; failures come back with
their reasons."""

import array
import math
import os
import unittest

from harness import (TRAIN_PATH, ClusterTest, jobs_pb2, parse_exposition, spec, spec_pb2,
                     wait_for)


def read_docs(prefix):
    tokens = array.array("H")
    with open(prefix + ".bin", "rb") as f:
        tokens.frombytes(f.read())
    offsets = array.array("Q")
    with open(prefix + ".idx", "rb") as f:
        f.seek(24)
        offsets.frombytes(f.read())
    return tokens, offsets


def unigram_baseline_nats():
    """Cross-entropy of the validation targets under the training split's
    token frequencies (add-one smoothed): what a model that ignores context
    can reach. Targets are every token but a document's first, as in the
    trainer."""
    train, _ = read_docs(TRAIN_PATH)
    counts = [1] * 258
    for t in train:
        counts[t] += 1
    total = sum(counts)
    val, offsets = read_docs(os.path.join(os.path.dirname(TRAIN_PATH), "val"))
    nats, n = 0.0, 0
    for d in range(len(offsets) - 1):
        for i in range(offsets[d] + 1, offsets[d + 1]):
            nats -= math.log(counts[val[i]] / total)
            n += 1
    return nats / n


class TrainingTest(ClusterTest):

    def test_trains_below_the_unigram_baseline_with_checkpoints(self):
        self.add_worker("w1")
        s = spec(max_steps=250, name="learns", checkpoint_interval=100)
        s.model.num_layers = 2
        s.model.d_model = 64
        s.model.num_heads = 4
        s.data.seq_len = 128
        s.training.micro_batch_rows = 8
        s.training.eval_interval_steps = 50
        s.training.eval_tokens = 16384
        s.optimizer.lr = 1e-2
        s.optimizer.min_lr = 1e-3
        s.optimizer.warmup_steps = 10
        s.optimizer.grad_clip = 1.0
        job = self.submit(s)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertEqual(done.step, 250)
        events = self.events(job.name)
        evals = [e for e in events if e.type == "eval"]
        self.assertEqual([e.step for e in evals], [0, 50, 100, 150, 200, 250])
        baseline = unigram_baseline_nats()
        first, last = evals[0].val_loss, evals[-1].val_loss
        print("\nval loss: step 0 %.4f, step 250 %.4f; unigram baseline %.4f nats/token"
              % (first, last, baseline))
        self.assertAlmostEqual(first, math.log(258), delta=0.1)  # an untrained model
        self.assertLess(last, 0.9 * baseline, "clearly below the unigram baseline")
        ckpts = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        self.assertEqual([c.step for c in ckpts], [100, 200, 250])
        for c in ckpts:
            self.assertTrue(os.path.exists(c.path), c.path)
            self.assertEqual(len(c.sha256), 64)
            self.assertGreater(c.tokens, 0)
        progress = [e for e in events if e.type == "progress"]
        self.assertTrue(progress)
        self.assertIn("useful tokens/s", progress[-1].detail)

    def test_an_fp8_job_trains_and_reports_its_fp8_statistics(self):
        self.add_worker("w1")
        s = spec(max_steps=400, name="fp8", checkpoint_interval=200)
        s.precision.compute = spec_pb2.PRECISION_FP8  # delayed scaling by default
        job = self.submit(s)
        wait_for(lambda: self.get(job.name).step >= 50, timeout=120, what="50 FP8 steps")
        series = parse_exposition(self.tallyd.scrape())
        label = 'tally_job="%s"' % job.name
        self.assertEqual(series["tally_job_fp8_product_fraction{%s}" % label], 1.0)
        self.assertIn("tally_job_fp8_overflows_total{%s}" % label, series)
        for group in ("attention.input", "attention.weight", "attention.grad", "ffn.input",
                      "ffn.weight", "ffn.grad"):
            self.assertGreater(series['tally_job_fp8_amax{group="%s",%s}' % (group, label)], 0)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertEqual(len(self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints), 2)

    def test_a_packed_fp8_moe_job_trains_end_to_end(self):
        self.add_worker("w1")
        s = spec(max_steps=300, name="packed-fp8-moe", checkpoint_interval=150)
        s.model.num_layers = 2
        s.model.d_model = 32
        s.model.num_heads = 2
        s.model.moe.num_experts = 4
        s.model.moe.top_k = 2
        s.model.moe.aux_loss_coef = 0.01
        s.model.moe.bias_balancing = True
        s.precision.compute = spec_pb2.PRECISION_FP8
        s.data.packing = spec_pb2.PACKING_MODE_PACKED
        s.training.eval_interval_steps = 100
        s.training.eval_tokens = 4096
        s.optimizer.lr = 3e-3
        job = self.submit(s)
        wait_for(lambda: self.get(job.name).step >= 30, timeout=120, what="30 steps")
        text = self.tallyd.scrape()
        label = 'tally_job="%s"' % job.name
        self.assertIn('tally_job_moe_max_over_mean_load{layer="0",%s}' % label, text)
        self.assertIn('tally_job_moe_expert_tokens{expert="3",layer="1",%s}' % label, text)
        self.assertIn("tally_job_fp8_product_fraction{%s} 1" % label, text)
        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        evals = [e for e in self.events(job.name) if e.type == "eval"]
        self.assertLess(evals[-1].val_loss, evals[0].val_loss - 1.0)
        self.assertIn('state="succeeded",tally_job="%s"} 1' % job.name, self.tallyd.scrape(),
                      "an ended job's series stay with its terminal state")

    def test_a_spec_the_worker_cannot_train_fails_with_the_field(self):
        self.add_worker("w1")
        missing = spec(max_steps=5)
        missing.data.train_path = "/nonexistent/train"
        done = self.wait_state(self.submit(missing).name, {jobs_pb2.JOB_STATE_FAILED}, timeout=60)
        self.assertIn("data.train_path", done.state_reason)
        self.assertIn("tally-prep", done.state_reason)
        self.assertEqual(done.attempt, 1, "not retried: another attempt would fail the same way")
        # BF16 on a CPU worker is BF16 autocast, as on CUDA: it trains.
        s = spec(max_steps=5)
        s.precision.compute = spec_pb2.PRECISION_BF16
        bf16 = self.submit(s)
        done = self.wait_state(bf16.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=120)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)


if __name__ == "__main__":
    unittest.main()


class CheckpointRootTest(ClusterTest):
    """tallyd's checkpoint_root: checkpoints are recorded only from the
    workers' checkpoint folder; one reported elsewhere fails its attempt."""

    def start_with_root(self, root):
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("checkpoint_root: %s\n" % root)
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()

    def test_checkpoints_in_the_root_are_recorded(self):
        root = os.path.realpath(os.path.join(self.dir, "checkpoints"))
        self.start_with_root(root)
        self.add_worker("w1")
        job = self.submit(spec(max_steps=20, checkpoint_interval=10))
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=60)
        listed = self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=done.name), timeout=10).checkpoints
        self.assertEqual([c.step for c in listed], [10, 20])
        for c in listed:
            self.assertTrue(c.path.startswith(root + "/job-"), c.path)

    def test_a_worker_writing_elsewhere_gets_no_checkpoint_recorded(self):
        # tallyd's root is not where this worker writes.
        self.start_with_root(os.path.realpath(self.dir) + "/elsewhere")
        self.add_worker("w1")
        job = self.submit(spec(max_steps=20, checkpoint_interval=10, max_attempts=1))
        failed = self.wait_state(job.name, jobs_pb2.JOB_STATE_FAILED, timeout=60)
        self.assertIn("checkpoint record refused", failed.state_reason)
        self.assertIn("tallyd's checkpoint_root", failed.state_reason)
        self.assertEqual(list(self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints), [])
        self.assertEqual(self.metric("tally_worker_reports_refused_total",
                                     kind="checkpoint_path"), 1)
