"""Tally's Hugging Face exports, loaded by transformers itself (the GPU
machine has it; make test checks the same folders with an independent numpy
implementation instead). Reads DIR (tests/gpu/make-hf-check.sh writes it):
dense/, moe/ and spm/ exported folders and logits.json, Tally's own logits
(tally-forward) for a few token sequences. Prints one line per check and
exits 1 if any fails."""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TOLERANCE = 1e-4  # max |transformers - tally| over max |logit|, FP32


def main(d):
    with open(os.path.join(d, "logits.json")) as f:
        expected = json.load(f)
    failed = 0

    def check(name, ok, detail):
        nonlocal failed
        failed += not ok
        print("%-4s %s: %s" % ("ok" if ok else "FAIL", name, detail), flush=True)

    for name in ("dense", "moe"):
        folder = os.path.join(d, name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.eval()
        worst = 0.0
        for seq, want in zip(expected["sequences"], expected[name]):
            with torch.no_grad():
                got = model(torch.tensor([seq])).logits[0].float()
            want = torch.tensor(want)
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        check("%s logits (%s)" % (name, type(model).__name__), worst < TOLERANCE,
              "max relative difference %.2e over %d sequences" % (worst,
                                                                  len(expected["sequences"])))
        with torch.no_grad():
            out = model.generate(torch.tensor([expected["sequences"][0][:4]]), max_new_tokens=8,
                                 do_sample=False)
        check("%s generate" % name, out.shape[1] == 12, "%d tokens" % out.shape[1])

    tok = AutoTokenizer.from_pretrained(os.path.join(d, "dense"))
    ids = tok("Hello, world")["input_ids"]
    want = [256] + list(b"Hello, world")
    check("byte tokenizer.json", ids == want and tok.decode(ids[1:]) == "Hello, world",
          "%s (want %s)" % (ids, want))

    # tally-prep encodes a document as BOS + SentencePiece's own ids (+ EOS);
    # the exported LlamaTokenizer must encode a prompt the same way.
    import sentencepiece
    text = "The quick brown fox jumps over the lazy dog."
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "spm", "tokenizer.model"))
    want = [sp.bos_id()] + sp.encode(text)
    ids = AutoTokenizer.from_pretrained(os.path.join(d, "spm"))(text)["input_ids"]
    check("sentencepiece tokenizer.model", ids == want, "%s (want %s)" % (ids[:12], want[:12]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
