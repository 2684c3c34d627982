"""Multi-GPU jobs on CPU: data-parallel ranks in separate processes joined by
PyTorch's c10d Gloo group on loopback. Two tally-train processes take the
same steps as one process over the same global batch (dense, and MoE with
the experts split over the ranks); a 2-rank expert-parallel MoE + FP8 job
through tallyd trains on two of three workers, survives a `kill -9` of either
rank (rank 0's worker also hosts the rendezvous) by being requeued as a whole,
and finishes from its last checkpoint on a different pair of workers."""

import json
import os
import re
import subprocess
import tempfile
import unittest

from google.protobuf import json_format

from harness import TALLY_TRAIN, ClusterTest, free_port, jobs_pb2, spec, spec_pb2, wait_for


def moe(s, fp8=False):
    s.model.moe.num_experts = 4
    s.model.moe.top_k = 2
    s.model.moe.aux_loss_coef = 0.01
    s.model.moe.bias_balancing = True
    s.model.moe.expert_parallel = True
    if fp8:
        s.precision.compute = spec_pb2.PRECISION_FP8
    return s


def dp_spec(max_steps, name="dp", checkpoint_interval=0):
    s = spec(max_steps=max_steps, name=name, gpu_count=2, checkpoint_interval=checkpoint_interval)
    s.model.num_layers = 2
    s.model.d_model = 32
    s.model.num_heads = 2
    s.data.seq_len = 128
    s.training.micro_batch_rows = 2
    # Four micro-batches a step: two per rank, so each rank accumulates
    # before the all-reduce and the sums' order differs from one process.
    s.training.global_batch_tokens = 4 * 128 * 2
    s.training.eval_interval_steps = 10
    s.training.eval_tokens = 4096
    s.optimizer.lr = 1e-2
    s.optimizer.warmup_steps = 2
    s.optimizer.grad_clip = 1.0
    return s


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class TallyTrainRanks(unittest.TestCase):

    def run_ranks(self, spec_path, world, out_dir):
        address = "127.0.0.1:%d" % free_port()
        procs = []
        for rank in range(world):
            args = [TALLY_TRAIN, "--spec=" + spec_path, "--threads=1", "--log_every=10",
                    "--metrics_out=%s/rank%d.jsonl" % (out_dir, rank)]
            if world > 1:
                args += ["--world_size=%d" % world, "--rank=%d" % rank,
                         "--rendezvous=" + address]
            procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        self.outputs = []
        for p in procs:
            out, _ = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, out)
            self.outputs.append(out)
        return read_jsonl(os.path.join(out_dir, "rank0.jsonl"))

    def compare(self, job_spec, what):
        d = tempfile.mkdtemp(prefix="tally_dp_")
        path = os.path.join(d, "spec.json")
        with open(path, "w") as f:
            f.write(json_format.MessageToJson(job_spec))
        os.mkdir(os.path.join(d, "one"))
        os.mkdir(os.path.join(d, "two"))
        one = self.run_ranks(path, 1, os.path.join(d, "one"))
        two = self.run_ranks(path, 2, os.path.join(d, "two"))
        steps_one = [r for r in one if "step" in r]
        steps_two = [r for r in two if "step" in r]
        self.assertEqual([r["step"] for r in steps_two], list(range(1, 21)))
        worst = 0.0
        for a, b in zip(steps_one, steps_two):
            self.assertEqual(a["tokens"], b["tokens"])
            rel = abs(a["train_loss"] - b["train_loss"]) / a["train_loss"]
            worst = max(worst, rel)
            self.assertLess(rel, 1e-5, "step %d: %r vs %r" % (a["step"], a, b))
        evals_one = [r["val_loss"] for r in one if "eval_step" in r]
        evals_two = [r["val_loss"] for r in two if "eval_step" in r]
        self.assertEqual(len(evals_one), 3)
        for a, b in zip(evals_one, evals_two):
            self.assertLess(abs(a - b) / a, 1e-5)
        self.assertLess(steps_two[-1]["train_loss"], steps_two[0]["train_loss"] - 0.5)
        print("\n%s, 2 ranks vs 1 process, 20 steps: largest relative loss difference %.2e"
              % (what, worst))
        # Rank 1 reports no steps of its own.
        self.assertEqual([r for r in read_jsonl(os.path.join(d, "two", "rank1.jsonl"))], [])

    def test_two_processes_take_the_steps_of_one(self):
        self.compare(dp_spec(20), "dense")

    def test_expert_parallel_ranks_take_the_steps_of_one(self):
        self.compare(moe(dp_spec(20)), "MoE, experts split over the ranks")
        # Each rank holds its own two experts of four per layer.
        total = int(re.search(r"tally-train: (\d+) parameters", self.outputs[0]).group(1))
        for out in self.outputs:
            held = int(re.search(r"experts sharded, (\d+) parameters held", out).group(1))
            self.assertLess(held, total)
        print("parameters: %d in the model, %d held by each rank" % (total, held))


class GangJobTest(ClusterTest):

    def test_a_lost_rank_requeues_the_job_which_resumes_on_other_workers(self):
        self.lose_a_rank(1)

    def test_losing_rank_zero_and_its_rendezvous_does_the_same(self):
        self.lose_a_rank(0)

    def lose_a_rank(self, rank):
        for w in ("w1", "w2", "w3"):
            self.add_worker(w)
        job = self.submit(moe(dp_spec(300, name="gang", checkpoint_interval=20), fp8=True))
        running = self.wait_state(job.name, jobs_pb2.JOB_STATE_RUNNING)
        first = list(running.worker_ids)
        self.assertEqual(len(first), 2)

        def checkpoints():
            return self.tallyd.jobs.ListCheckpoints(
                jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        wait_for(lambda: len(checkpoints()) > 0, timeout=120, what="a first checkpoint")
        # Kill one rank's worker: the other fails its next collective (rank
        # 0's worker also hosts the rendezvous store).
        victim = next(w for w in self.workers if w.worker_id == first[rank])
        victim.kill()
        lost_at = self.get(job.name).step
        self.assertLess(lost_at, 300, "the job ended before a rank could be lost")

        done = self.wait_state(job.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED},
                               timeout=300)
        self.assertEqual(done.state, jobs_pb2.JOB_STATE_SUCCEEDED, done.state_reason)
        self.assertEqual(done.step, 300)
        self.assertEqual(done.attempt, 2)
        second = list(done.worker_ids)
        self.assertNotIn(first[rank], second)
        self.assertNotEqual(sorted(first), sorted(second))
        events = self.events(job.name)
        requeued = [e for e in events if e.type == "requeued"]
        self.assertEqual(len(requeued), 1)
        started = [e for e in events if e.type == "started"]
        self.assertEqual(len(started), 2)
        self.assertIn("resuming from step", started[1].detail)
        resumed_from = int(started[1].detail.rsplit(" ", 1)[1])
        self.assertGreaterEqual(resumed_from, 20)
        print("\nrank %d lost at step ~%d (%s); requeued: %s; attempt 2 on %s resumed from step %d"
              % (rank, lost_at, first[rank], requeued[0].reason, ",".join(second), resumed_from))
        evals = [e for e in events if e.type == "eval"]
        self.assertLess(evals[-1].val_loss, evals[0].val_loss - 1.0)


if __name__ == "__main__":
    unittest.main()
