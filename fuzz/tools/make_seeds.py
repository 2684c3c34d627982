#!/usr/bin/env python3
"""Writes the generated seed inputs of fuzz/corpus/ deterministically.

scheduler_fuzz: operation sequences of a few hundred bytes (pseudo-random,
fixed seed), so that runs start from long sequences of operations.

dataset_fuzz: small valid datasets in dataset_fuzz's framing (uint16 idx_len,
uint16 json_len, .idx, .json, .bin), as tally-prep writes them.
checkpoint_fuzz: small valid checkpoints in checkpoint_fuzz's framing (a flags
byte, then the file without its SHA-256 trailer, which the target appends).

Run from anywhere: python3 fuzz/tools/make_seeds.py
"""
import hashlib
import json
import os
import random
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dataset(docs, with_sha=True, extra=None):
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d))
    idx = b"TALLYIDX" + struct.pack("<IIQ", 1, 2, len(docs))
    idx += b"".join(struct.pack("<Q", o) for o in offsets)
    bin_ = b"".join(struct.pack("<%dH" % len(d), *d) for d in docs)
    hist = {}
    for d in docs:
        b = 0
        while (2 << b) <= len(d):
            b += 1
        hist[str(1 << b)] = hist.get(str(1 << b), 0) + 1
    meta = {
        "format": "tally-indexed-dataset", "version": 1, "tokenizer": "byte",
        "vocab_size": 258, "bos": 256, "eos": 257, "token_bytes": 2,
        "num_docs": len(docs), "num_tokens": offsets[-1],
        "max_doc_tokens": max(len(d) for d in docs),
        "doc_tokens_histogram_log2": hist,
    }
    if with_sha:
        meta["content_sha256"] = {"bin": hashlib.sha256(bin_).hexdigest(),
                                  "idx": hashlib.sha256(idx).hexdigest()}
    if extra:
        meta["extra"] = extra
    js = json.dumps(meta, indent=2).encode() + b"\n"
    return struct.pack("<HH", len(idx), len(js)) + idx + js + bin_


def doc(text):
    return [256] + list(text.encode()) + [257]


# c10::ScalarType values: Byte 0, Char 1, Short 2, Int 3, Long 4, Half 5,
# Float 6, Double 7, Bool 11, BFloat16 15.
def checkpoint(meta, tensors, flags=0):
    out = b"TALLYCKP" + struct.pack("<I", 1)
    m = json.dumps(meta).encode()
    out += struct.pack("<Q", len(m)) + m + struct.pack("<Q", len(tensors))
    for name, dtype, sizes, data in tensors:
        n = name.encode()
        out += struct.pack("<I", len(n)) + n + struct.pack("<bI", dtype, len(sizes))
        out += b"".join(struct.pack("<q", s) for s in sizes)
        out += struct.pack("<Q", len(data)) + data
    return bytes([flags]) + out


def floats(values):
    return struct.pack("<%df" % len(values), *values)


def write(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    write("dataset_fuzz", "three-docs", dataset(
        [doc("Hi"), doc("a fortune"), [256, 257]], extra={"split": "train"}))
    write("dataset_fuzz", "one-doc-no-sha", dataset([doc("x")], with_sha=False))
    write("dataset_fuzz", "many-docs", dataset(
        [doc("doc %d " % i * (i % 7 + 1)) for i in range(40)]))

    write("checkpoint_fuzz", "empty", checkpoint({"step": 0}, []))
    write("checkpoint_fuzz", "model", checkpoint(
        {"step": 100, "val_loss": 2.5, "tokens": 25600},
        [("tok_emb.weight", 6, [4, 3], floats([0.5 * i for i in range(12)])),
         ("blocks.0.ln.weight", 6, [3], floats([1.0, 1.0, 1.0])),
         ("opt.step", 4, [], struct.pack("<q", 100)),
         ("rng", 0, [8], bytes(range(8))),
         ("half", 15, [2, 2], bytes(range(8)))]))
    write("checkpoint_fuzz", "model-expected-sha", checkpoint(
        {"step": 1}, [("w", 7, [2], struct.pack("<2d", 1.0, -2.0))], flags=2))

    rng = random.Random(20261203)
    for n in (64, 256, 1024, 4096):
        write("scheduler_fuzz", "ops-%d" % n, bytes(rng.randrange(256) for _ in range(n)))


if __name__ == "__main__":
    main()
