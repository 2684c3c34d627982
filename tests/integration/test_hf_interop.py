"""Hugging Face export and import, as a user runs them: tally-train writes
checkpoints, tally-export turns one into a Hugging Face folder, and
model.init_from starts a fine-tune from that folder or from a checkpoint.

The exported folder is checked without transformers: hf_reference.py is an
independent numpy implementation of LlamaForCausalLM and MixtralForCausalLM
written from the Hugging Face model code's semantics (its own safetensors
parser, rotate_half RoPE, Mixtral's renormalised top-k softmax routing). Its
logits on a few token sequences must match Tally's own forward
(tally-forward) on the checkpoint, in FP32, to a tight tolerance."""

import hashlib
import json
import os
import struct
import subprocess
import tempfile
import unittest

from google.protobuf import json_format

import harness
from harness import BUILD, TRAIN_PATH, TALLY_TRAIN

import hf_reference

EXPORT = os.path.join(BUILD, "worker", "tally-export")
FORWARD = os.path.join(BUILD, "worker", "tally-forward")

# Token sequences: BOS + text bytes, a longer one (RoPE over many positions)
# and arbitrary ids (specials included).
SEQUENCES = [
    [256] + list(b"Hello, world. The quick brown fox."),
    [256] + list(b"%s" % (b"Fortune favours the bold; " * 5)),
    [257, 3, 200, 256, 10, 32, 255, 0, 65],
]


def write_spec(path, model, steps, seed=1, extra=None):
    spec = {
        "model": model,
        "data": {"train_path": TRAIN_PATH, "seq_len": 128},
        "training": {"max_steps": steps, "micro_batch_rows": 4, "eval_interval_steps": steps,
                     "eval_tokens": 4096, "seed": seed},
        "optimizer": {"lr": 3e-3, "warmup_steps": 2},
    }
    for key, value in (extra or {}).items():
        spec.setdefault(key, {}).update(value)
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def read_json(path):
    with open(path) as f:
        return json.load(f)


def train(spec_path, out_dir, check=True):
    """tally-train; returns (completed process, steps, evals) from its JSON lines."""
    metrics = os.path.join(out_dir, "metrics.jsonl")
    p = subprocess.run([TALLY_TRAIN, "--spec=" + spec_path, "--checkpoint_dir=" + out_dir,
                        "--metrics_out=" + metrics, "--log_every=1000"],
                       capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError("tally-train failed:\n" + p.stdout + p.stderr)
    steps, evals = {}, {}
    if os.path.exists(metrics):
        with open(metrics) as f:
            lines = f.readlines()
        for line in lines:
            r = json.loads(line)
            if "eval_step" in r:
                evals[r["eval_step"]] = r["val_loss"]
            else:
                steps[r["step"]] = r["train_loss"]
    return p, steps, evals


def export(args, check=True):
    p = subprocess.run([EXPORT] + args, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError("tally-export failed:\n" + p.stdout + p.stderr)
    return p


def tally_logits(flag):
    p = subprocess.run([FORWARD, flag, "--tokens=" + ";".join(
        ",".join(str(t) for t in s) for s in SEQUENCES)], capture_output=True, text=True,
        timeout=300, check=True)
    return json.loads(p.stdout)["logits"]


def max_rel_diff(a, b):
    """Largest |a - b| over the largest |b|, over every position and logit."""
    top = max(abs(x) for row in b for x in row)
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / top


def read_checkpoint(path):
    """A Tally checkpoint's metadata and tensors (name -> (dtype, shape, bytes)),
    parsed from its documented layout (worker/train/checkpoint.h)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"TALLYCKP"
    at = 12
    (meta_len,) = struct.unpack_from("<Q", data, at)
    at += 8
    meta = json.loads(data[at:at + meta_len])
    at += meta_len
    (count,) = struct.unpack_from("<Q", data, at)
    at += 8
    tensors = []
    for _ in range(count):
        (name_len,) = struct.unpack_from("<I", data, at)
        at += 4
        name = data[at:at + name_len].decode()
        at += name_len
        dtype, ndim = struct.unpack_from("<bI", data, at)
        at += 5
        shape = struct.unpack_from("<%dq" % ndim, data, at)
        at += 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", data, at)
        at += 8
        tensors.append([name, dtype, shape, bytearray(data[at:at + nbytes])])
        at += nbytes
    return meta, tensors


def write_checkpoint(path, meta, tensors):
    """Writes a checkpoint with a valid internal checksum (the trailer), as
    the trainer would: only a recorded SHA-256 can tell it from the original."""
    out = bytearray(b"TALLYCKP" + struct.pack("<I", 1))
    m = json.dumps(meta).encode()
    out += struct.pack("<Q", len(m)) + m + struct.pack("<Q", len(tensors))
    for name, dtype, shape, raw in tensors:
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<bI", dtype, len(shape))
        out += struct.pack("<%dq" % len(shape), *shape) + struct.pack("<Q", len(raw)) + raw
    out += hashlib.sha256(out).digest()
    with open(path, "wb") as f:
        f.write(bytes(out))
    return hashlib.sha256(bytes(out)).hexdigest()


def set_float(path, out, tensor, value):
    """A copy of checkpoint `path` at `out` with `tensor`'s first float set."""
    meta, tensors = read_checkpoint(path)
    for t in tensors:
        if t[0] == tensor:
            struct.pack_into("<f", t[3], 0, value)
    return write_checkpoint(out, meta, tensors)


class HfInteropTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tally_hf_")
        cls.dense = os.path.join(cls.dir, "dense")
        os.makedirs(cls.dense)
        _, cls.dense_steps, cls.dense_evals = train(write_spec(
            os.path.join(cls.dir, "dense.json"),
            {"num_layers": 2, "d_model": 64, "num_heads": 4}, steps=20), cls.dense)
        cls.dense_ckpt = os.path.join(cls.dense, "step-00000020.ckpt")
        cls.moe = os.path.join(cls.dir, "moe")
        os.makedirs(cls.moe)
        train(write_spec(os.path.join(cls.dir, "moe.json"),
                         {"num_layers": 2, "d_model": 64, "num_heads": 4,
                          "moe": {"num_experts": 4, "top_k": 2}}, steps=10), cls.moe)
        cls.moe_ckpt = os.path.join(cls.moe, "step-00000010.ckpt")

    def check_against_reference(self, ckpt, out, architecture):
        p = export(["--checkpoint=" + ckpt, "--out=" + out])
        self.assertIn(architecture, p.stdout)
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json"):
            self.assertTrue(os.path.isfile(os.path.join(out, f)), f)
        config = read_json(os.path.join(out, "config.json"))
        self.assertEqual(config["architectures"], [architecture])
        reference = hf_reference.load_model(out)
        ours = tally_logits("--checkpoint=" + ckpt)
        for seq, logits in zip(SEQUENCES, ours):
            theirs = reference.logits(seq).tolist()
            diff = max_rel_diff(theirs, logits)
            print("%s, %d tokens: max |numpy - tally| / max |logit| = %.2e"
                  % (architecture, len(seq), diff))
            self.assertLess(diff, 1e-4)
        return config

    def test_dense_export_matches_an_independent_llama(self):
        config = self.check_against_reference(self.dense_ckpt, os.path.join(self.dir, "hf_dense"),
                                              "LlamaForCausalLM")
        self.assertEqual(config["model_type"], "llama")
        self.assertEqual((config["hidden_size"], config["num_hidden_layers"],
                          config["num_attention_heads"], config["vocab_size"]), (64, 2, 4, 258))
        self.assertEqual((config["bos_token_id"], config["eos_token_id"]), (256, 257))

    def test_moe_export_matches_an_independent_mixtral(self):
        config = self.check_against_reference(self.moe_ckpt, os.path.join(self.dir, "hf_moe"),
                                              "MixtralForCausalLM")
        self.assertEqual((config["num_local_experts"], config["num_experts_per_tok"]), (4, 2))

    def test_bf16_export_halves_the_weights_and_stays_close(self):
        out = os.path.join(self.dir, "hf_bf16")
        export(["--checkpoint=" + self.dense_ckpt, "--out=" + out, "--dtype=bf16"])
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
        self.assertEqual(dtypes, {"BF16"})
        self.assertEqual(read_json(os.path.join(out, "config.json"))["torch_dtype"],
                         "bfloat16")
        reference = hf_reference.load_model(out)
        ours = tally_logits("--checkpoint=" + self.dense_ckpt)
        diff = max_rel_diff(reference.logits(SEQUENCES[0]).tolist(), ours[0])
        self.assertLess(diff, 5e-2)  # BF16 weights: 8 bits of mantissa
        self.assertGreater(diff, 0)  # and not the FP32 weights after all

    def test_shapes_neither_class_expresses_are_refused(self):
        cases = [
            ({"num_experts": 4, "top_k": 2, "router": "sigmoid"}, "model.moe.router is sigmoid"),
            ({"num_experts": 4, "top_k": 2, "shared_expert": True}, "shared_expert"),
            ({"num_experts": 4, "top_k": 1}, "model.moe.top_k is 1"),
            ({"num_experts": 4, "top_k": 2, "every_n_layers": 2}, "every_n_layers is 2"),
        ]
        for i, (moe, message) in enumerate(cases):
            with self.subTest(moe=moe):
                d = os.path.join(self.dir, "refused%d" % i)
                os.makedirs(d)
                train(write_spec(os.path.join(d, "spec.json"),
                                 {"num_layers": 2, "d_model": 32, "num_heads": 2, "moe": moe},
                                 steps=2), d)
                out = os.path.join(d, "hf")
                p = export(["--checkpoint=" + os.path.join(d, "step-00000002.ckpt"),
                            "--out=" + out], check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(message, p.stderr)
                self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))

    def test_balancing_biases_are_refused_unless_dropped(self):
        d = os.path.join(self.dir, "biased")
        os.makedirs(d)
        train(write_spec(os.path.join(d, "spec.json"),
                         {"num_layers": 1, "d_model": 32, "num_heads": 2,
                          "moe": {"num_experts": 4, "top_k": 2, "bias_balancing": True}},
                         steps=5), d)
        ckpt = os.path.join(d, "step-00000005.ckpt")
        p = export(["--checkpoint=" + ckpt, "--out=" + os.path.join(d, "hf")], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("balancing biases", p.stderr)
        self.assertIn("bias_balancing: false", p.stderr)
        export(["--checkpoint=" + ckpt, "--out=" + os.path.join(d, "hf"),
                "--drop_routing_bias"])

    def test_usage_errors_exit_2(self):
        for args, message in [
            ([], "--out is required"),
            (["--out=/tmp/x"], "give --checkpoint=FILE or --job=jobs/N"),
            (["--out=/tmp/x", "--checkpoint=a", "--dtype=fp16"], "--dtype"),
            (["--out=/tmp/x", "--checkpoint=a", "--format=gguf"], "--format"),
            (["--out=/tmp/x", "--job=jobs/1", "--which=worst"], "--which"),
        ]:
            with self.subTest(args=args):
                p = export(args, check=False)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(message, p.stderr)

    def test_damaged_checkpoint_is_refused(self):
        bad = os.path.join(self.dir, "bad.ckpt")
        with open(self.dense_ckpt, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        with open(bad, "wb") as f:
            f.write(bytes(data))
        p = export(["--checkpoint=" + bad, "--out=" + os.path.join(self.dir, "hf_bad")],
                   check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("bad.ckpt", p.stderr)

    def test_non_finite_weights_are_refused_naming_the_tensor(self):
        for value in (float("nan"), float("inf")):
            with self.subTest(value=value):
                bad = os.path.join(self.dir, "nonfinite.ckpt")
                set_float(self.dense_ckpt, bad, "model.layers.1.w2", value)
                p = export(["--checkpoint=" + bad, "--out=" + os.path.join(self.dir, "hf_nan")],
                           check=False)
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                self.assertIn("tensor model.layers.1.w2 holds NaN or infinite values", p.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.dir, "hf_nan",
                                                             "model.safetensors")))

    def test_a_sentencepiece_checkpoint_without_its_model_path_says_what_is_missing(self):
        meta, tensors = read_checkpoint(self.dense_ckpt)
        meta["tokenizer"] = {"kind": "sentencepiece", "vocab_size": 258, "bos": 256, "eos": 257,
                             "model_path": "", "model_sha256": "ab" * 32}
        ckpt = os.path.join(self.dir, "spm_no_path.ckpt")
        write_checkpoint(ckpt, meta, tensors)
        p = export(["--checkpoint=" + ckpt, "--out=" + os.path.join(self.dir, "hf_spm")],
                   check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("records no path to its model", p.stderr)
        self.assertIn("--tokenizer_model=PATH", p.stderr)
        self.assertNotIn("model , ", p.stderr)

    def test_init_from_a_huge_finite_weight_fails_naming_the_tensor(self):
        huge = os.path.join(self.dir, "huge.ckpt")
        set_float(self.dense_ckpt, huge, "model.layers.0.wqkv", 3e38)
        p, steps, evals = self.fine_tune("ft_huge", {"checkpoint": huge}, check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("layers.0.wqkv holds a weight of magnitude 3e+38", p.stderr)
        self.assertEqual(evals, {})
        self.assertEqual(steps, {})

    def test_standalone_resume_checks_the_recorded_sha256(self):
        sidecar = self.dense_ckpt + ".sha256"
        with open(sidecar) as f:
            recorded = f.read().split()[0]
        with open(self.dense_ckpt, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), recorded)
        spec = write_spec(os.path.join(self.dir, "resume.json"),
                          {"num_layers": 2, "d_model": 64, "num_heads": 4}, steps=22)

        def resume(ckpt, *flags):
            return subprocess.run([TALLY_TRAIN, "--spec=" + spec, "--resume=" + ckpt,
                                   "--log_every=1000"] + list(flags),
                                  capture_output=True, text=True, timeout=300)

        # The metadata rewritten with a valid internal checksum, beside the
        # original's sidecar.
        d = os.path.join(self.dir, "resume_edited")
        os.makedirs(d)
        edited = os.path.join(d, "step-00000020.ckpt")
        meta, tensors = read_checkpoint(self.dense_ckpt)
        meta["tokens"] -= 1
        write_checkpoint(edited, meta, tensors)
        with open(edited + ".sha256", "w") as f:
            f.write("%s  step-00000020.ckpt\n" % recorded)
        p = resume(edited)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("but the checkpoint was recorded with " + recorded, p.stderr)
        self.assertIn("came from " + edited + ".sha256", p.stderr)
        # The same, with the SHA-256 given on the command line and no sidecar.
        os.remove(edited + ".sha256")
        p = resume(edited, "--resume_sha256=" + recorded)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("but the checkpoint was recorded with " + recorded, p.stderr)
        # With neither, only the internal checksum can be checked: it says so.
        p = resume(edited)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("checked only against its own internal checksum", p.stderr)
        # The original resumes, checked against its sidecar.
        p = resume(self.dense_ckpt)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("against the SHA-256 in " + sidecar, p.stdout)
        self.assertIn("resumed at step 20", p.stdout)
        p = resume(self.dense_ckpt, "--resume_sha256=xyz")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--resume_sha256", p.stderr)

    def fine_tune(self, name, init_from, model=None, extra=None, check=True):
        d = os.path.join(self.dir, name)
        os.makedirs(d)
        m = dict(model or {"num_layers": 2, "d_model": 64, "num_heads": 4})
        m["init_from"] = init_from
        return train(write_spec(os.path.join(d, "spec.json"), m, steps=4, seed=7, extra=extra),
                     d, check=check)

    def test_round_trip_export_then_fine_tune(self):
        hf = os.path.join(self.dir, "hf_round_trip")
        export(["--checkpoint=" + self.dense_ckpt, "--out=" + hf])
        _, from_hf, evals_hf = self.fine_tune("ft_hf", {"hf": hf})
        _, from_ckpt, evals_ckpt = self.fine_tune("ft_ckpt", {"checkpoint": self.dense_ckpt})
        # The fine-tune's first evaluation is the exported model's: the same
        # weights on the same validation tokens as the source run's last one.
        self.assertAlmostEqual(evals_hf[0], self.dense_evals[20], delta=1e-6 * evals_hf[0])
        # Its first step is the exported model's loss on that batch: equal
        # whether the weights came through the Hugging Face folder or not.
        self.assertAlmostEqual(from_hf[1], from_ckpt[1], delta=1e-6 * from_hf[1])
        self.assertEqual(sorted(from_hf), [1, 2, 3, 4])
        self.assertLess(evals_hf[0], 5.0)  # trained weights, not a fresh init (ln 258 = 5.55)

    def test_fine_tune_with_fp8_and_from_a_mixtral_folder(self):
        hf = os.path.join(self.dir, "hf_moe_ft")
        export(["--checkpoint=" + self.moe_ckpt, "--out=" + hf])
        _, steps, evals = self.fine_tune(
            "ft_moe", {"hf": hf},
            model={"num_layers": 2, "d_model": 64, "num_heads": 4,
                   "moe": {"num_experts": 4, "top_k": 2}},
            extra={"precision": {"compute": "PRECISION_FP8"}})
        self.assertEqual(sorted(steps), [1, 2, 3, 4])
        self.assertLess(evals[0], 5.0)

    def test_a_spec_contradicting_the_folder_is_refused_naming_the_field(self):
        hf = os.path.join(self.dir, "hf_contradicted")
        export(["--checkpoint=" + self.dense_ckpt, "--out=" + hf])
        p, _, _ = self.fine_tune("ft_wrong", {"hf": hf},
                                 model={"num_layers": 2, "d_model": 128, "num_heads": 4},
                                 check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("model.d_model is 128", p.stdout + p.stderr)
        self.assertIn("config.json has 64", p.stdout + p.stderr)
        p, _, _ = self.fine_tune("ft_missing", {"hf": os.path.join(self.dir, "nowhere")},
                                 check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("config.json: no such file", p.stdout + p.stderr)


class HfInteropThroughTallydTest(harness.ClusterTest):
    """The same through tallyd: a spec with model.init_from, tallyctl
    checkpoints naming the best one and its export command, and tally-export
    --job reading tallyd's records."""

    def test_fine_tune_job_and_export_by_job_name(self):
        d = tempfile.mkdtemp(prefix="tally_hf_job_")
        _, _, _ = train(write_spec(os.path.join(d, "base.json"),
                                   {"num_layers": 2, "d_model": 64, "num_heads": 4}, steps=10), d)
        hf = os.path.join(d, "hf")
        export(["--checkpoint=" + os.path.join(d, "step-00000010.ckpt"), "--out=" + hf])
        self.add_worker("w1")
        s = harness.spec(max_steps=6)
        s.model.num_layers, s.model.d_model, s.model.num_heads = 2, 64, 4
        s.data.seq_len = 128
        s.model.init_from.hf = hf
        s.training.eval_interval_steps = 3
        s.training.checkpoint_interval_steps = 3
        job = self.submit(s)
        self.wait_state(job.name, harness.TERMINAL, timeout=120)
        self.assertEqual(self.get(job.name).state, harness.jobs_pb2.JOB_STATE_SUCCEEDED,
                         self.get(job.name).state_reason)
        out = self.tallyctl("checkpoints", job.name)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("best:", out.stdout)
        self.assertIn("tally-export --job=%s --which=best" % job.name, out.stdout)
        dest = os.path.join(d, "exported")
        p = export(["--job=" + job.name, "--which=best", "--out=" + dest,
                    "--controller=" + self.tallyd.grpc_addr])
        self.assertIn("LlamaForCausalLM", p.stdout)
        self.assertTrue(os.path.isfile(os.path.join(dest, "model.safetensors")))
        p = export(["--job=" + job.name, "--which=latest", "--out=" + dest,
                    "--controller=" + self.tallyd.grpc_addr])
        self.assertIn("(step 6)", p.stdout)


class UpcycleDistillThroughTallydTest(harness.ClusterTest):
    """Changing the model through tallyd: a dense checkpoint upcycled to an
    MoE job (it starts at the dense model's loss, tallyctl get says where it
    came from, tally-export --job writes Mixtral) and a 1-layer student
    distilled from it (priced with its teacher by tallyctl estimate); bad
    specs are refused by tallyctl validate naming the field, and the example
    experiment file is valid."""

    def setUp(self):
        super().setUp()
        self.d = tempfile.mkdtemp(prefix="tally_grow_job_")
        _, _, evals = train(write_spec(os.path.join(self.d, "dense.json"),
                                       {"num_layers": 2, "d_model": 64, "num_heads": 4},
                                       steps=10), self.d)
        self.dense = os.path.join(self.d, "step-00000010.ckpt")
        self.dense_loss = evals[10]

    def job_spec(self, layers=2):
        s = harness.spec(max_steps=6)
        s.model.num_layers, s.model.d_model, s.model.num_heads = layers, 64, 4
        s.data.seq_len = 128
        s.training.micro_batch_rows = 4
        s.training.eval_interval_steps = 3
        s.training.eval_tokens = 4096
        s.training.checkpoint_interval_steps = 3
        return s

    def test_upcycled_job_starts_as_the_dense_model_and_exports_as_mixtral(self):
        self.add_worker("w1")
        s = self.job_spec()
        s.model.moe.num_experts = 4
        s.model.moe.top_k = 2
        s.model.init_from.checkpoint = self.dense
        s.model.init_from.upcycle.noise_std = 0.0
        job = self.submit(s)
        self.wait_state(job.name, harness.TERMINAL, timeout=120)
        j = self.get(job.name)
        self.assertEqual(j.state, harness.jobs_pb2.JOB_STATE_SUCCEEDED, j.state_reason)
        self.assertAlmostEqual(j.curve[0].val_loss, self.dense_loss, delta=1e-4 * self.dense_loss)
        self.assertEqual(j.curve[0].step, 0)
        out = self.tallyctl("get", job.name)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("upcycled from " + self.dense + " (noise_std 0)", out.stdout)
        self.assertIn("MoE 4x top-2", out.stdout)
        dest = os.path.join(self.d, "exported")
        p = export(["--job=" + job.name, "--which=latest", "--out=" + dest,
                    "--controller=" + self.tallyd.grpc_addr])
        self.assertIn("MixtralForCausalLM", p.stdout)
        checkpoints = self.tallyd.jobs.ListCheckpoints(
            harness.jobs_pb2.ListCheckpointsRequest(name=job.name), timeout=10).checkpoints
        meta, _ = read_checkpoint(checkpoints[-1].path)
        with open(self.dense, "rb") as f:
            self.assertEqual(meta["init_from"]["sha256"], hashlib.sha256(f.read()).hexdigest())
        self.assertEqual(meta["init_from"]["upcycled"]["step"], 0)

    def test_distilled_job_is_priced_with_its_teacher(self):
        self.add_worker("w1")
        s = self.job_spec(layers=1)
        s.training.distill.teacher.checkpoint = self.dense
        s.training.distill.temperature = 2
        s.training.distill.alpha = 0.5
        spec_path = os.path.join(self.d, "student.json")
        with open(spec_path, "w") as f:
            f.write(json_format.MessageToJson(s))
        out = self.tallyctl("estimate", "-f", spec_path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("not priced", out.stdout)
        s.training.distill.teacher.model.num_layers = 2
        s.training.distill.teacher.model.d_model = 64
        s.training.distill.teacher.model.num_heads = 4
        with open(spec_path, "w") as f:
            f.write(json_format.MessageToJson(s))
        out = self.tallyctl("estimate", "-f", spec_path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"distillation teacher: [0-9.e+]+ forward FLOPs/token")
        job = self.submit(s)
        self.wait_state(job.name, harness.TERMINAL, timeout=120)
        j = self.get(job.name)
        self.assertEqual(j.state, harness.jobs_pb2.JOB_STATE_SUCCEEDED, j.state_reason)
        out = self.tallyctl("get", job.name)
        self.assertIn("teacher:   %s, alpha 0.5, temperature 2" % self.dense, out.stdout)

        # A teacher of another shape than the one stated fails the job, naming it.
        s.training.distill.teacher.model.d_model = 128
        s.training.distill.teacher.model.num_heads = 4
        job = self.submit(s)
        self.wait_state(job.name, harness.TERMINAL, timeout=120)
        j = self.get(job.name)
        self.assertEqual(j.state, harness.jobs_pb2.JOB_STATE_FAILED)
        self.assertIn("training.distill.teacher.model.d_model is 128", j.state_reason)

        # tallyctl validate names the field.
        bad = os.path.join(self.d, "bad.yaml")
        with open(bad, "w") as f:
            f.write("model: {num_layers: 1, d_model: 64, num_heads: 4}\n"
                    "data: {train_path: %s, seq_len: 128}\n"
                    "training: {max_steps: 5, distill: {teacher: {checkpoint: %s}, alpha: 2}}\n"
                    % (TRAIN_PATH, self.dense))
        out = self.tallyctl("validate", "-f", bad)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("spec.training.distill.alpha", out.stdout + out.stderr)
        example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "examples", "experiments", "upcycle.yaml")
        out = self.tallyctl("experiment", "validate", "-f", example)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)


if __name__ == "__main__":
    unittest.main()
