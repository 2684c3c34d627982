"""The validation loss of a GGUF model as llama.cpp computes it, scored on the
same tokens as Tally's evaluation with eval_tokens 0 (the whole split).

Run with the llama-cpp virtual environment's Python (scripts/setup.sh makes
it in the cache, $CACHE_DIR/llama-cpp-VERSION):

  python gguf_loss.py --gguf=model.gguf --data=DIR/val --seq_len=128 [--max_docs=N]

prints {"loss": ..., "targets": ..., "docs": ...}.

Tally's evaluation (worker/data/eval_sample.h, packer.h; Run::Evaluate in
worker/train/trainer.cc) lays the split's documents into rows, but attention
stays within a document and positions restart at 0 in each, so where a
document lands does not change its loss. Each document is therefore scored
on its own: one longer than seq_len is cut into seq_len-token chunks (the
last shorter), each scored from position 0 in a fresh KV cache; a chunk of n
tokens has n - 1 targets; empty documents are skipped. The loss is the sum of
the cross-entropy over all targets divided by their number (token-weighted),
the log-softmax taken over llama.cpp's logits in float64.

The KV cache is kept in FP32 (llama.cpp's default is F16), so that what is
compared is the model's weights and llama.cpp's matrix products, not a
rounding of the cache that Tally's evaluation does not have.

The dataset (worker/data/dataset.h): PREFIX.idx is "TALLYIDX", uint32
version, uint32 bytes per token (2 or 4), uint64 num_docs, uint64
offsets[num_docs + 1]; PREFIX.bin holds the tokens, little-endian."""

import argparse
import json
import os
import struct
import sys

import numpy as np

GGML_TYPE_F32 = 0


def read_dataset(prefix):
    """(token array, offsets) of a tally-prep dataset."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(24)
        if len(header) != 24 or header[:8] != b"TALLYIDX":
            raise SystemExit("%s.idx: not a Tally dataset index" % prefix)
        version, token_bytes, num_docs = struct.unpack("<IIQ", header[8:])
        if version not in (1, 2) or token_bytes not in (2, 4):
            raise SystemExit("%s.idx: version %d with %d-byte tokens is not readable here"
                             % (prefix, version, token_bytes))
        offsets = np.fromfile(f, dtype="<u8", count=num_docs + 1)
    if len(offsets) != num_docs + 1:
        raise SystemExit("%s.idx: truncated (%d of %d offsets)"
                         % (prefix, len(offsets), num_docs + 1))
    tokens = np.fromfile(prefix + ".bin", dtype="<u2" if token_bytes == 2 else "<u4")
    if len(tokens) != int(offsets[-1]):
        raise SystemExit("%s.bin: %d tokens, the index says %d"
                         % (prefix, len(tokens), int(offsets[-1])))
    return tokens, offsets


# GGML tensor types by id (ggml.h's enum ggml_type), those an export holds.
GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 8: "q8_0", 30: "bf16"}
# GGUF metadata value types: struct format of the fixed-size ones (8: string, 9: array).
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                11: "q", 12: "d"}


def tensor_types(path):
    """{tensor name: type ("q8_0", "f16", ...)} from a GGUF file's header (v2 or v3)."""
    with open(path, "rb") as f:
        def take(fmt):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def skip_value(kind):
            if kind == 8:
                f.seek(take("Q"), os.SEEK_CUR)
            elif kind == 9:
                element, n = take("I"), take("Q")
                if element in GGUF_SCALARS:
                    f.seek(n * struct.calcsize(GGUF_SCALARS[element]), os.SEEK_CUR)
                else:
                    for _ in range(n):
                        skip_value(element)
            else:
                f.seek(struct.calcsize(GGUF_SCALARS[kind]), os.SEEK_CUR)

        if f.read(4) != b"GGUF" or take("I") not in (2, 3):
            raise SystemExit("%s: not a GGUF file (version 2 or 3)" % path)
        num_tensors, num_kv = take("Q"), take("Q")
        for _ in range(num_kv):
            f.seek(take("Q"), os.SEEK_CUR)  # the key
            skip_value(take("I"))
        types = {}
        for _ in range(num_tensors):
            name = f.read(take("Q")).decode("utf-8")
            f.seek(8 * take("I"), os.SEEK_CUR)  # the dimensions
            kind = take("I")
            take("Q")  # the data's offset
            types[name] = GGML_TYPES.get(kind, "type %d" % kind)
        return types


def chunks(tokens, offsets, seq_len, max_docs):
    """Yields (document, chunk of at most seq_len tokens) as Tally's packer cuts them."""
    num_docs = len(offsets) - 1
    if max_docs > 0:
        num_docs = min(num_docs, max_docs)
    for d in range(num_docs):
        begin, end = int(offsets[d]), int(offsets[d + 1])
        for at in range(begin, end, seq_len):
            yield d, tokens[at:min(end, at + seq_len)]


def chunk_loss(llm, chunk):
    """Sum of the cross-entropy over the chunk's len - 1 targets."""
    llm.reset()
    llm.eval([int(t) for t in chunk])
    logits = np.asarray(llm.scores[:len(chunk) - 1], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    targets = np.asarray(chunk[1:], dtype=np.int64)
    return float((log_z - logits[np.arange(len(targets)), targets]).sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="the model file")
    parser.add_argument("--data", required=True,
                        help="a tally-prep dataset prefix (DIR/val: DIR/val.bin, .idx, .json)")
    parser.add_argument("--seq_len", type=int, required=True,
                        help="the training spec's data.seq_len (documents are cut at it)")
    parser.add_argument("--max_docs", type=int, default=0,
                        help="score only the first N documents (0: all)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tensor_types", action="store_true",
                        help="also print each tensor's type, read from the file's header")
    args = parser.parse_args()
    if args.seq_len < 2:
        raise SystemExit("--seq_len: must be >= 2")

    tokens, offsets = read_dataset(args.data)
    import llama_cpp  # after the arguments: --help works without the library
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=args.seq_len, n_batch=args.seq_len,
                          n_ubatch=args.seq_len, logits_all=True, n_threads=args.threads,
                          n_threads_batch=args.threads, type_k=GGML_TYPE_F32,
                          type_v=GGML_TYPE_F32, verbose=False)
    vocab = llm.n_vocab()
    if len(tokens) and int(tokens.max()) >= vocab:
        raise SystemExit("%s: token id %d is outside the model's %d-token vocabulary"
                         % (args.data, int(tokens.max()), vocab))

    loss_sum, targets, docs = 0.0, 0, set()
    for doc, chunk in chunks(tokens, offsets, args.seq_len, args.max_docs):
        if len(chunk) < 2:
            continue  # a one-token chunk has no target
        loss_sum += chunk_loss(llm, chunk)
        targets += len(chunk) - 1
        docs.add(doc)
    if targets == 0:
        raise SystemExit("%s: no document with a target" % args.data)
    result = {"loss": loss_sum / targets, "targets": targets, "docs": len(docs)}
    if args.tensor_types:
        result["tensor_types"] = tensor_types(args.gguf)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
