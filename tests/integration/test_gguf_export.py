"""GGUF export, as a user runs it: tally-train writes checkpoints, tally-export
--format=gguf turns one into a llama.cpp file (F16, Q8_0 or Q4_0).

The file is checked without llama.cpp first: this module reads GGUF from the
format's description (its own parser, ggml's block layouts) and runs an
independent NumPy model with llama.cpp's llama-architecture semantics (RoPE
on adjacent pairs of the stored rows, softmax top-k routing renormalised over
the chosen experts). Its logits must match Tally's own forward (tally-forward)
on the checkpoint: tightly for F16, within the quantization's error for Q8_0
and Q4_0, whose dequantized weights must also be the checkpoint's, rounded
to their blocks' steps (q and k put back in Tally's row order).

Then, where llama-cpp-python is installed (the virtual environment
scripts/setup.sh makes in its cache, llama-cpp-*; TALLY_LLAMA_CPP naming that
folder, or TALLY_LLAMA_CPP_PYTHON its python), llama.cpp itself loads the
files: "hello world" tokenizes to Tally's ids (byte and SentencePiece
tokenizers) and its logits match tally-forward's."""

import glob
import json
import math
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np

from harness import BUILD, FORTUNES, TALLY_PREP
import test_hf_interop as hfi

EXPORT = hfi.EXPORT
CORPUS = [os.path.join(FORTUNES, f + ".u8") for f in ("fortunes", "literature", "science")]
TEXT = "hello world. Fortune favours the bold; the quick brown fox jumps over the lazy dog."


def llama_cpp_python():
    """The python of a virtual environment with llama_cpp, or None."""
    given = os.environ.get("TALLY_LLAMA_CPP_PYTHON")
    if given:
        return given if os.access(given, os.X_OK) else None
    venv = os.environ.get("TALLY_LLAMA_CPP")  # the environment's folder, as CMake passes it
    if venv:
        python = os.path.join(venv, "bin", "python")
        ok = os.access(python, os.X_OK) and subprocess.run(
            [python, "-c", "import llama_cpp"], capture_output=True).returncode == 0
        return python if ok else None
    cache = os.environ.get("TALLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tally")
    for python in sorted(glob.glob(os.path.join(cache, "llama-cpp-*", "bin", "python")),
                         reverse=True):
        if subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
            return python
    return None


# --- GGUF, read from the format's description ---------------------------------------------

def read_gguf(path):
    """(metadata dict, {name: (ne, type, bytes)}) of a GGUF v3 file."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"GGUF", data[:4]
    at = 4

    def take(fmt):
        nonlocal at
        values = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string():
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n:at].decode("utf-8")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            element, n = take("I"), take("Q")
            return [value(element) for _ in range(n)]
        return take(scalar[kind])

    version, tensors, kvs = take("I"), take("Q"), take("Q")
    assert version == 3
    meta = {}
    for _ in range(kvs):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(tensors):
        name = string()
        dims = take("I")
        ne = [take("Q") for _ in range(dims)]
        infos.append((name, ne, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    start = (at + align - 1) // align * align
    sizes = {0: (4, 1), 1: (2, 1), 8: (34, 32), 2: (18, 32)}
    out, expected = {}, 0
    for name, ne, kind, offset in infos:
        assert offset == expected, (name, offset, expected)
        per, block = sizes[kind]
        n = (math.prod(ne) // block) * per
        out[name] = (ne, kind, data[start + offset:start + offset + n])
        expected += (n + align - 1) // align * align
    assert len(data) == start + expected, (len(data), start + expected)
    return meta, out


def values(tensor):
    """A tensor's values in float64, shaped as PyTorch would (ne reversed)."""
    ne, kind, raw = tensor
    shape = tuple(reversed(ne))
    if kind in (0, 1):
        return np.frombuffer(raw, "<f4" if kind == 0 else "<f2").astype(np.float64).reshape(shape)
    per = 34 if kind == 8 else 18
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, per)
    d = blocks[:, :2].copy().view("<f2").astype(np.float64)
    if kind == 8:
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
    else:
        nibbles = blocks[:, 2:]
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=1).astype(np.float64) - 8
    return (q * d).reshape(shape)


def steps(tensor):
    """Each weight's block scale |d| (the quantization step), shaped as values()."""
    ne, kind, raw = tensor
    per = 34 if kind == 8 else 18
    d = np.frombuffer(raw, np.uint8).reshape(-1, per)[:, :2].copy().view("<f2")
    return np.repeat(np.abs(d.astype(np.float64)), 32, axis=1).reshape(tuple(reversed(ne)))


def tally_rows(w, heads):
    """Tally's row order of a q or k projection from llama.cpp's (rows 2j, 2j + 1 of a
    head are its rows j, j + K/2)."""
    k = w.shape[0] // heads
    return w.reshape(heads, k // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


# --- llama.cpp's llama architecture, in NumPy ---------------------------------------------

def rms_norm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope_adjacent(x, base):
    """x [T, H, K]: pairs (2j, 2j + 1) rotated by pos * base^(-2j/K) (GGML_ROPE_TYPE_NORM)."""
    t, _, k = x.shape
    angle = np.arange(t)[:, None] * base ** (-np.arange(0, k, 2) / k)[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def llama_logits(meta, t, ids):
    w = {name: values(tensor) for name, tensor in t.items()}
    heads, eps = meta["llama.attention.head_count"], meta["llama.attention.layer_norm_rms_epsilon"]
    base, used = meta["llama.rope.freq_base"], meta.get("llama.expert_used_count", 0)
    x = w["token_embd.weight"][ids]
    n, d = x.shape
    k = d // heads
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(meta["llama.block_count"]):
        b = "blk.%d." % i
        h = rms_norm(x, w[b + "attn_norm.weight"], eps)
        q = rope_adjacent((h @ w[b + "attn_q.weight"].T).reshape(n, heads, k), base)
        kk = rope_adjacent((h @ w[b + "attn_k.weight"].T).reshape(n, heads, k), base)
        v = (h @ w[b + "attn_v.weight"].T).reshape(n, heads, k)
        s = np.einsum("qhk,phk->hqp", q, kk) / math.sqrt(k) + causal
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("hqp,phk->qhk", p, v).reshape(n, d) @ w[b + "attn_output.weight"].T
        h = rms_norm(x, w[b + "ffn_norm.weight"], eps)
        if b + "ffn_gate_inp.weight" not in w:
            x = x + (silu(h @ w[b + "ffn_gate.weight"].T) * (h @ w[b + "ffn_up.weight"].T)) \
                @ w[b + "ffn_down.weight"].T
            continue
        logits = h @ w[b + "ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        for row in range(n):
            chosen = np.argsort(-probs[row], kind="stable")[:used]
            gates = probs[row, chosen] / probs[row, chosen].sum()
            for e, g in zip(chosen, gates):
                up = silu(w[b + "ffn_gate_exps.weight"][e] @ h[row]) * \
                    (w[b + "ffn_up_exps.weight"][e] @ h[row])
                x[row] = x[row] + g * (w[b + "ffn_down_exps.weight"][e] @ up)
    return rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


def rel_diff(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


def tally_logits(ckpt, ids):
    p = subprocess.run([hfi.FORWARD, "--checkpoint=" + ckpt, "--tokens=" + ",".join(map(str, ids))],
                       capture_output=True, text=True, timeout=300, check=True)
    return json.loads(p.stdout)["logits"][0]


LLAMA_CPP_SCRIPT = r"""
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], logits_all=True, n_ctx=512, n_threads=2, verbose=False)
ids = llm.tokenize(sys.argv[2].encode(), add_bos=True)
llm.eval(ids)
print(json.dumps({"ids": ids, "text": llm.detokenize(ids).decode(),
                  "logits": [list(map(float, row)) for row in llm.scores[:len(ids)]]}))
"""


class GgufExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tally_gguf_")
        cls.dense = os.path.join(cls.dir, "dense")
        os.makedirs(cls.dense)
        hfi.train(hfi.write_spec(os.path.join(cls.dir, "dense.json"),
                                 {"num_layers": 2, "d_model": 64, "num_heads": 4}, steps=20),
                  cls.dense)
        cls.dense_ckpt = os.path.join(cls.dense, "step-00000020.ckpt")
        cls.moe = os.path.join(cls.dir, "moe")
        os.makedirs(cls.moe)
        hfi.train(hfi.write_spec(os.path.join(cls.dir, "moe.json"),
                                 {"num_layers": 2, "d_model": 64, "num_heads": 4,
                                  "moe": {"num_experts": 4, "top_k": 2}}, steps=10), cls.moe)
        cls.moe_ckpt = os.path.join(cls.moe, "step-00000010.ckpt")
        cls.llama_cpp = llama_cpp_python()

    def export(self, ckpt, name, *flags, check=True):
        out = os.path.join(self.dir, name)
        p = hfi.export(["--checkpoint=" + ckpt, "--format=gguf", "--out=" + out] + list(flags),
                       check=check)
        return out, p

    def test_f16_matches_tally_in_an_independent_llama(self):
        ids = [256] + list(TEXT.encode())
        for ckpt, name in ((self.dense_ckpt, "dense.gguf"), (self.moe_ckpt, "moe.gguf")):
            with self.subTest(name=name):
                out, p = self.export(ckpt, name)
                self.assertIn("llama GGUF", p.stdout)
                meta, t = read_gguf(out)
                self.assertEqual(meta["general.architecture"], "llama")
                self.assertEqual(meta["general.file_type"], 1)
                self.assertEqual(meta["llama.context_length"], 128)
                self.assertEqual(meta["tokenizer.ggml.model"], "gpt2")
                self.assertEqual(len(meta["tokenizer.ggml.tokens"]), 258)
                self.assertEqual({kind for _, kind, _ in t.values()}, {0, 1})
                if name == "moe.gguf":
                    self.assertEqual((meta["llama.expert_count"],
                                      meta["llama.expert_used_count"]), (4, 2))
                diff = rel_diff(llama_logits(meta, t, ids), tally_logits(ckpt, ids))
                print("%s: max |numpy - tally| / max |logit| = %.2e" % (name, diff))
                self.assertLess(diff, 2e-3)

    def test_quantized_weights_are_the_checkpoints_rounded_and_logits_stay_close(self):
        _, raw = hfi.read_checkpoint(self.dense_ckpt)
        ckpt = {name[6:]: np.frombuffer(bytes(data), "<f4").astype(np.float64).reshape(shape)
                for name, _, shape, data in raw if name.startswith("model.")}
        ids = [256] + list(TEXT.encode())
        theirs = tally_logits(self.dense_ckpt, ids)
        for quant, layers, bound in (("q8_0", "ffn", 2e-3), ("q8_0", "all_linear", 5e-3),
                                     ("q4_0", "ffn", 1e-2), ("q4_0", "all_linear", 3e-2)):
            with self.subTest(quant=quant, layers=layers):
                out, p = self.export(self.dense_ckpt, "%s-%s.gguf" % (quant, layers),
                                     "--quant=" + quant, "--quant_layers=" + layers)
                self.assertIn("%s %s" % (quant, layers), p.stdout)
                meta, t = read_gguf(out)
                kind = 8 if quant == "q8_0" else 2
                # Rounding to the nearest code (Q4_0's top code clamped: a whole
                # step), plus the scale's rounding to F16 times the largest code.
                bound_steps = 0.5 + 127 / 1024 if kind == 8 else 1 + 8 / 1024
                d = 64
                for i in range(2):
                    b, s = "blk.%d." % i, "layers.%d." % i
                    pairs = [("ffn_gate", ckpt[s + "w1"]), ("ffn_up", ckpt[s + "w3"]),
                             ("ffn_down", ckpt[s + "w2"])]
                    if layers == "all_linear":
                        wqkv = ckpt[s + "wqkv"]
                        pairs += [("attn_q", wqkv[:d]), ("attn_k", wqkv[d:2 * d]),
                                  ("attn_v", wqkv[2 * d:]), ("attn_output", ckpt[s + "wo"])]
                    else:
                        self.assertEqual(t[b + "attn_q.weight"][1], 1)
                    for gguf, want in pairs:
                        tensor = t[b + gguf + ".weight"]
                        self.assertEqual(tensor[1], kind, gguf)
                        got, step = values(tensor), steps(tensor)
                        if gguf in ("attn_q", "attn_k"):
                            got, step = tally_rows(got, 4), tally_rows(step, 4)
                        self.assertTrue(np.all(np.abs(got - want) <= bound_steps * step), gguf)
                self.assertEqual(t["token_embd.weight"][1], 1)
                self.assertEqual(t["output.weight"][1], 1)
                diff = rel_diff(llama_logits(meta, t, ids), theirs)
                print("%s %s: max |numpy - tally| / max |logit| = %.2e" % (quant, layers, diff))
                self.assertLess(diff, bound)

    def test_llama_cpp_loads_tokenizes_and_agrees(self):
        if self.llama_cpp is None:
            self.skipTest("llama-cpp-python is not installed (scripts/setup.sh builds it)")
        for ckpt, name, flags, bound in ((self.dense_ckpt, "lc-f16.gguf", [], 2e-3),
                                         (self.dense_ckpt, "lc-q8.gguf", ["--quant=q8_0"], 5e-3),
                                         (self.moe_ckpt, "lc-moe.gguf", [], 2e-3)):
            with self.subTest(name=name):
                out, _ = self.export(ckpt, name, *flags)
                p = subprocess.run([self.llama_cpp, "-c", LLAMA_CPP_SCRIPT, out, "hello world"],
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stderr)
                got = json.loads(p.stdout.splitlines()[-1])
                self.assertEqual(got["ids"], [256] + list(b"hello world"))
                self.assertEqual(got["text"], "hello world")
                diff = rel_diff(got["logits"], tally_logits(ckpt, got["ids"]))
                print("llama.cpp %s: max |llama.cpp - tally| / max |logit| = %.2e" % (name, diff))
                self.assertLess(diff, bound)

    def test_llama_cpp_tokenizes_as_the_sentencepiece_model_did(self):
        if self.llama_cpp is None:
            self.skipTest("llama-cpp-python is not installed (scripts/setup.sh builds it)")
        d = os.path.join(self.dir, "spm")
        model = os.path.join(d, "tok.model")
        os.makedirs(d)

        def run(args):
            subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)

        run([TALLY_PREP, "train-tokenizer", "--vocab_size=500", "--out=" + model] + CORPUS)
        # The text as one document among others, to read back the ids tally-prep gave it.
        corpus = os.path.join(d, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("\n\n".join([TEXT] + ["line %d of filler" % i for i in range(300)]) + "\n")
        run([TALLY_PREP, "--out=" + os.path.join(d, "data"), "--split=blank",
                 "--tokenizer=sentencepiece:" + model, corpus])
        docs = []
        for split in ("train", "val"):
            tokens = np.fromfile(os.path.join(d, "data", split + ".bin"), "<u2").tolist()
            while 2 in tokens:
                end = tokens.index(2) + 1
                docs.append(tokens[:end])
                tokens = tokens[end:]
        want = max(docs, key=len)[:-1]  # [BOS, ids...] without EOS
        ckpt_dir = os.path.join(d, "ckpt")
        os.makedirs(ckpt_dir)
        hfi.train(hfi.write_spec(os.path.join(d, "spec.json"),
                                 {"num_layers": 1, "d_model": 32, "num_heads": 2}, steps=4,
                                 extra={"data": {"train_path": os.path.join(d, "data", "train")}}),
                  ckpt_dir)
        ckpt = os.path.join(ckpt_dir, "step-00000004.ckpt")
        out, _ = self.export(ckpt, "spm.gguf")
        meta, _ = read_gguf(out)
        self.assertEqual(meta["tokenizer.ggml.model"], "llama")
        self.assertEqual(len(meta["tokenizer.ggml.tokens"]), 500)
        p = subprocess.run([self.llama_cpp, "-c", LLAMA_CPP_SCRIPT, out, TEXT],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout.splitlines()[-1])
        self.assertEqual(got["ids"], want)
        self.assertLess(rel_diff(got["logits"], tally_logits(ckpt, got["ids"])), 2e-3)

    def test_refusals_name_the_tensor_or_flag_and_leave_no_file(self):
        huge = os.path.join(self.dir, "huge.ckpt")
        hfi.set_float(self.dense_ckpt, huge, "model.layers.0.wqkv", 3e38)
        out, p = self.export(huge, "huge.gguf", check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("tensor layers.0.wqkv holds a weight of magnitude 3e+38 at [0, 0]",
                      p.stderr)
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(out + ".tmp"))
        hf = os.path.join(self.dir, "huge_hf")
        p = hfi.export(["--checkpoint=" + huge, "--out=" + hf], check=False)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("tensor layers.0.wqkv holds a weight of magnitude 3e+38", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(hf, "model.safetensors")))
        for args, message in [
            (["--format=gguf", "--dtype=bf16"], "--dtype applies to --format=hf"),
            (["--quant=q8_0"], "--quant applies to --format=gguf"),
            (["--format=gguf", "--quant_layers=ffn"], "--quant_layers applies to --quant=q8_0"),
            (["--format=gguf", "--quant=q5_k"], "--quant: must be f16, q8_0 or q4_0"),
            (["--format=gguf", "--quant=q8_0", "--quant_layers=attn"], "--quant_layers: must be"),
        ]:
            with self.subTest(args=args):
                out = os.path.join(self.dir, "usage.gguf")
                p = hfi.export(["--checkpoint=" + self.dense_ckpt, "--out=" + out] + args,
                               check=False)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(message, p.stderr)
                self.assertFalse(os.path.exists(out))
        p = hfi.export(["--checkpoint=" + self.dense_ckpt, "--format=gguf",
                        "--out=" + os.path.join(self.dir, "model.bin")], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("ending in .gguf", p.stderr)


if __name__ == "__main__":
    unittest.main()
