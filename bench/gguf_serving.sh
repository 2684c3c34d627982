#!/usr/bin/env bash
# Serving a GGUF export on the CPU: one model (d_model 512, 8 layers, 8
# heads, the byte tokenizer; trained a few steps on fortunes, as the weights'
# values do not matter for speed) exported as F16, Q8_0 and Q4_0 (all
# linears quantized), each run by llama.cpp (llama-cpp-python, built by
# scripts/setup.sh into its cache). Per export: the file's size, prompt
# processing tokens/s (a 128-token prompt in one batch) and generation
# tokens/s (64 tokens one at a time, greedy, after that prompt), on
# THREADS threads (default 2), the median of REPEATS runs (default 7); the
# three exports take turns within each repeat, so load on the machine falls
# on all alike. Prints a markdown table.
#   bench/gguf_serving.sh        # about 11 s here (3 s once the model and its
#                                # exports exist)
#   THREADS=1 REPEATS=15 bench/gguf_serving.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/gguf_serving
THREADS=${THREADS:-2}
REPEATS=${REPEATS:-7}
CACHE_DIR=${TALLY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tally}
LLAMA_CPP=${LLAMA_CPP:-$CACHE_DIR/llama-cpp-$(sed -n 's/^LLAMA_CPP_VERSION=//p' scripts/setup.sh)}
if [ ! -x "$LLAMA_CPP/bin/python" ]; then
  echo "gguf_serving: llama-cpp-python is missing at $LLAMA_CPP: run scripts/setup.sh" >&2
  exit 1
fi
mkdir -p "$OUT"
. bench/lib/models.sh
ensure_fortunes

# The model, trained again only when this spec changes. Its context (seq_len
# 256) holds the prompt and the generated tokens.
STEPS=3
CKPT=$OUT/model/step-$(printf %08d $STEPS).ckpt
cat >"$OUT/model.yaml.new" <<YAML
model: {num_layers: 8, d_model: 512, num_heads: 8}
data: {train_path: $B/demo/fortunes/train, seq_len: 256}
training: {max_steps: $STEPS, micro_batch_rows: 2, eval_interval_steps: $STEPS,
           eval_tokens: 1024, seed: 1}
optimizer: {lr: 1e-3, warmup_steps: 1}
YAML
if [ ! -s "$CKPT" ] || ! cmp -s "$OUT/model.yaml.new" "$OUT/model.yaml"; then
  rm -rf "$OUT/model"
  mv "$OUT/model.yaml.new" "$OUT/model.yaml"
  "$B/worker/tally-train" --spec="$OUT/model.yaml" --checkpoint_dir="$OUT/model" \
    --threads="$THREADS" --log_every=1000 >"$OUT/train.log"
fi
rm -f "$OUT/model.yaml.new"
for quant in f16 q8_0 q4_0; do
  gguf=$OUT/model-$quant.gguf
  if [ ! -s "$gguf" ] || [ "$gguf" -ot "$CKPT" ]; then
    layers=()
    [ $quant = f16 ] || layers=(--quant_layers=all_linear)
    "$B/worker/tally-export" --checkpoint="$CKPT" --format=gguf --quant=$quant "${layers[@]}" \
      --out="$gguf" >"$OUT/export-$quant.log"
  fi
done

"$LLAMA_CPP/bin/python" - "$OUT" "$THREADS" "$REPEATS" <<'PY'
import os, statistics, sys, time
import numpy as np
import llama_cpp

out, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PROMPT, GENERATE = 128, 64
text = (b"Serving a model exported from Tally: llama.cpp reads the GGUF file, "
        b"maps its tensors and runs them on the CPU. " * 4)
prompt = [256] + list(text[:PROMPT - 1])  # BOS, then bytes

models = {}
for quant in ("f16", "q8_0", "q4_0"):
    path = "%s/model-%s.gguf" % (out, quant)
    llm = llama_cpp.Llama(model_path=path, n_ctx=PROMPT + GENERATE, n_batch=PROMPT,
                          n_ubatch=PROMPT, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    models[quant] = (path, llm)

def run(llm):
    """(prompt tokens/s, generation tokens/s) of one prompt and greedy continuation."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prompt_s = time.perf_counter() - start
    n_vocab = llm.n_vocab()
    start = time.perf_counter()
    for _ in range(GENERATE):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                       shape=(n_vocab,))
        llm.eval([int(logits.argmax())])
    generate_s = time.perf_counter() - start
    return PROMPT / prompt_s, GENERATE / generate_s

times = {q: [] for q in models}
for _, llm in models.values():
    run(llm)  # warm-up: page in the weights, repack Q4_0
for _ in range(repeats):
    for quant, (_, llm) in models.items():
        times[quant].append(run(llm))

f16_bytes = os.path.getsize(models["f16"][0])
print("%d-thread CPU, llama-cpp-python %s; d_model 512, 8 layers, vocab 258; median of %d"
      % (threads, llama_cpp.__version__, repeats))
print()
print("| export | file MiB | vs f16 | prompt tok/s (%d) | generation tok/s (%d) |"
      % (PROMPT, GENERATE))
print("|---|---:|---:|---:|---:|")
for quant, (path, _) in models.items():
    size = os.path.getsize(path)
    pp = statistics.median(t[0] for t in times[quant])
    tg = statistics.median(t[1] for t in times[quant])
    layers = "" if quant == "f16" else " all_linear"
    print("| %s%s | %.1f | %.2fx | %.0f | %.1f |"
          % (quant, layers, size / 2**20, size / f16_bytes, pp, tg))
PY
