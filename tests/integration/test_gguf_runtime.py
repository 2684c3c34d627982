"""GGUF export run by llama.cpp itself: tally-train trains tiny models with
quantization-aware training (training.qat), tally-export writes each final
checkpoint as GGUF in the format and layers it trained for, and llama.cpp
(llama-cpp-python, built by scripts/setup.sh into its cache) scores the
whole validation split (tests/support/gguf_loss.py). Its loss must equal the
trainer's last quantized_val_loss (the model as the export holds it) within
0.5%, and an F16 export's must equal val_loss within 0.5%: a layout, scale,
RoPE or routing mistake in the export moves the loss by far more.

Dense and MoE (Mixtral-style experts), Q8_0 and Q4_0, ffn and all_linear:
four models, a few seconds of training each, two at a time."""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness
from harness import BUILD, ROOT, TALLY_PREP, TALLY_TRAIN

EXPORT = os.path.join(BUILD, "worker", "tally-export")
GGUF_LOSS = os.path.join(ROOT, "tests", "support", "gguf_loss.py")
LLAMA_CPP = os.environ.get("TALLY_LLAMA_CPP", "")
LLAMA_PYTHON = os.path.join(LLAMA_CPP, "bin", "python")
SHAKESPEARE = os.environ.get(
    "TALLY_SHAKESPEARE", os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
# The first ~300 KB of the text: ~100 validation speeches, ~15k tokens.
CORPUS_BYTES = 300_000
SEQ_LEN = 128
STEPS = 150
TOLERANCE = 0.005  # relative
# The matrices each --quant_layers quantizes (Mixtral-style experts are one
# tensor per projection); never the embedding, norms, router or output head.
QUANTIZED = {
    "ffn": re.compile(r"blk\.\d+\.ffn_(gate|up|down)(_exps)?\.weight"),
    "all_linear": re.compile(
        r"blk\.\d+\.(ffn_(gate|up|down)(_exps)?|attn_(q|k|v|output))\.weight"),
}

DENSE = {"num_layers": 2, "d_model": 64, "num_heads": 4}
MOE = dict(DENSE, moe={"num_experts": 4, "top_k": 2})
# (name, model, QAT format, QAT layers, also export F16)
MODELS = [
    ("dense-q8_0-ffn", DENSE, "q8_0", "ffn", True),
    ("dense-q4_0-all_linear", DENSE, "q4_0", "all_linear", False),
    ("moe-q4_0-ffn", MOE, "q4_0", "ffn", True),
    ("moe-q8_0-all_linear", MOE, "q8_0", "all_linear", False),
]


def prepare_corpus(out):
    """tinyshakespeare's first CORPUS_BYTES cut into speeches (the fortunes
    corpus where the text is missing); returns the dataset folder."""
    if os.path.isfile(SHAKESPEARE):
        with open(SHAKESPEARE, "rb") as f:
            text = f.read(CORPUS_BYTES)
        text = text[:text.rfind(b"\n\n") + 1]
        source = os.path.join(out, "shakespeare.txt")
        with open(source, "wb") as f:
            f.write(text)
        args = ["--split=blank", source]
    else:
        args = [os.path.join(harness.FORTUNES, "fortunes.u8")]
    data = os.path.join(out, "data")
    subprocess.run([TALLY_PREP, "--out=" + data] + args, check=True, capture_output=True)
    return data


def train(out, name, model, fmt, layers, data):
    """Trains one model; returns (checkpoint, last evaluation's JSON line)."""
    run = os.path.join(out, name)
    os.makedirs(run)
    spec = {
        "model": model,
        "data": {"train_path": os.path.join(data, "train"), "seq_len": SEQ_LEN},
        "training": {"max_steps": STEPS, "micro_batch_rows": 8, "eval_interval_steps": STEPS,
                     "eval_tokens": 0, "seed": 1, "qat": {"format": fmt, "layers": layers}},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10, "grad_clip": 1.0},
    }
    with open(run + ".json", "w") as f:
        json.dump(spec, f)
    metrics = os.path.join(run, "metrics.jsonl")
    p = subprocess.run([TALLY_TRAIN, "--spec=" + run + ".json", "--checkpoint_dir=" + run,
                        "--metrics_out=" + metrics, "--threads=1", "--log_every=1000"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("tally-train %s failed:\n%s%s" % (name, p.stdout, p.stderr))
    with open(metrics) as f:
        evals = [json.loads(line) for line in f if '"eval_step"' in line]
    return os.path.join(run, "step-%08d.ckpt" % STEPS), evals[-1]


def export(ckpt, out, quant, layers=None):
    args = [EXPORT, "--checkpoint=" + ckpt, "--format=gguf", "--quant=" + quant, "--out=" + out]
    if layers:
        args.append("--quant_layers=" + layers)
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("tally-export %s failed:\n%s%s" % (" ".join(args[1:]), p.stdout,
                                                                p.stderr))


def llama_cpp_loss(gguf, val):
    p = subprocess.run([LLAMA_PYTHON, GGUF_LOSS, "--gguf=" + gguf, "--data=" + val,
                        "--seq_len=%d" % SEQ_LEN, "--threads=1", "--tensor_types"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("gguf_loss.py %s failed:\n%s%s" % (gguf, p.stdout, p.stderr))
    return json.loads(p.stdout)


class GgufRuntimeTest(unittest.TestCase):
    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(LLAMA_PYTHON):
            raise unittest.SkipTest(
                "llama-cpp-python's virtual environment is missing (%s): scripts/setup.sh "
                "builds it (`make setup`)" % (LLAMA_CPP or "TALLY_LLAMA_CPP is unset"))
        cls.dir = tempfile.mkdtemp(prefix="tally_gguf_")
        data = prepare_corpus(cls.dir)
        cls.val = os.path.join(data, "val")

        # Each model trained, exported and scored on one thread, two at a time.
        def one(entry):
            name, model, fmt, layers, with_f16 = entry
            ckpt, last = train(cls.dir, name, model, fmt, layers, data)
            rows = []
            gguf = os.path.join(cls.dir, name + ".gguf")
            export(ckpt, gguf, fmt, layers)
            rows.append((name, "%s %s" % (fmt, layers), "quantized_val_loss",
                         last["quantized_val_loss"], last["eval_targets"],
                         llama_cpp_loss(gguf, cls.val)))
            if with_f16:
                gguf = os.path.join(cls.dir, name + "-f16.gguf")
                export(ckpt, gguf, "f16")
                rows.append((name, "f16", "val_loss", last["val_loss"], last["eval_targets"],
                             llama_cpp_loss(gguf, cls.val)))
            return rows

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            cls.rows = [r for rows in pool.map(one, MODELS) for r in rows]
        print("\n%-22s %-16s %-19s %9s %9s %8s" % ("model (QAT)", "export", "Tally metric",
                                                   "Tally", "llama.cpp", "rel diff"))
        for name, export_as, metric, tally, _, theirs in cls.rows:
            print("%-22s %-16s %-19s %9.5f %9.5f %+7.3f%%" % (
                name, export_as, metric, tally, theirs["loss"],
                100 * (theirs["loss"] - tally) / tally))

    def test_scored_tokens_match(self):
        """llama.cpp scored exactly the targets Tally's evaluation scored."""
        for name, export_as, _, _, targets, theirs in self.rows:
            self.assertEqual(theirs["targets"], targets, "%s %s" % (name, export_as))

    def test_quantized_exports_match_quantized_val_loss(self):
        rows = [r for r in self.rows if r[2] == "quantized_val_loss"]
        self.assertEqual(len(rows), len(MODELS))
        for name, export_as, _, tally, _, theirs in rows:
            self.assertLess(abs(theirs["loss"] - tally) / tally, TOLERANCE,
                            "%s exported %s: llama.cpp %.5f, Tally's quantized_val_loss %.5f"
                            % (name, export_as, theirs["loss"], tally))

    def test_scored_files_hold_the_formats_compared(self):
        """The losses compared are of files quantized as named: a loss match
        alone could not tell, since QAT leaves quantized_val_loss close to
        val_loss."""
        for name, export_as, _, _, _, theirs in self.rows:
            fmt, layers = (export_as.split() + [None])[:2]
            quantized = sorted(t for t, kind in theirs["tensor_types"].items()
                               if kind in ("q8_0", "q4_0"))
            expected = sorted(t for t in theirs["tensor_types"]
                              if layers and QUANTIZED[layers].fullmatch(t))
            self.assertTrue(fmt == "f16" or expected, "%s: no %s tensors" % (name, layers))
            self.assertEqual(quantized, expected, "%s %s" % (name, export_as))
            for t in quantized:
                self.assertEqual(theirs["tensor_types"][t], fmt, "%s %s" % (name, t))

    def test_f16_exports_match_val_loss(self):
        rows = [r for r in self.rows if r[1] == "f16"]
        self.assertEqual(len(rows), 2)
        for name, _, _, tally, _, theirs in rows:
            self.assertLess(abs(theirs["loss"] - tally) / tally, TOLERANCE,
                            "%s exported f16: llama.cpp %.5f, Tally's val_loss %.5f"
                            % (name, theirs["loss"], tally))

    def test_models_learned(self):
        """The comparison is of trained models, not of near-uniform outputs."""
        for name, _, _, tally, _, _ in self.rows:
            self.assertLess(tally, 3.5, name)


if __name__ == "__main__":
    unittest.main()
