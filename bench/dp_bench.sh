#!/usr/bin/env bash
# Data parallel on this machine: the same spec and global batch trained by
# one tally-train process and by two ranks joined by c10d's Gloo group on
# loopback, side by side, one CPU thread per process. Twice: a dense model,
# then an MoE model whose two ranks split (and hold) its experts (expert
# parallelism). Prints step time, useful tokens/s, the loss each reaches
# (they must agree) and the parameters each process holds. Asserts nothing;
# the README records its tables. Usage: bench/dp_bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BUILD_DIR:-build}}
STEPS=${STEPS:-40}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
[ -s "$B/demo/fortunes/train.idx" ] ||
  "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8 >/dev/null

# run NAME MODEL: one process, then two ranks, on the same spec.
run() {
  cat >"$tmp/$1.yaml" <<YAML
model: $2
data: {train_path: $B/demo/fortunes/train, seq_len: 512}
training: {micro_batch_rows: 4, global_batch_tokens: 8192, max_steps: $STEPS, seed: 1}
optimizer: {lr: 3e-3, warmup_steps: 5, grad_clip: 1.0}
resources: {gpu_type: cpu, gpu_count: 2}
YAML
  local port=$((30000 + RANDOM % 20000))
  "$B/worker/tally-train" --spec="$tmp/$1.yaml" --threads=1 --log_every=1000 \
    --metrics_out="$tmp/$1-one.jsonl" >"$tmp/$1-one.out"
  for r in 0 1; do
    "$B/worker/tally-train" --spec="$tmp/$1.yaml" --threads=1 --log_every=1000 \
      --world_size=2 --rank=$r --rendezvous=127.0.0.1:$port \
      --metrics_out="$tmp/$1-two-$r.jsonl" >"$tmp/$1-two-$r.out" &
  done
  wait
}
run dense "{num_layers: 2, d_model: 128, num_heads: 4}"
run moe "{num_layers: 2, d_model: 128, num_heads: 4, moe: {num_experts: 8, top_k: 2, expert_parallel: true}}"

/usr/bin/python3 - "$tmp" "$STEPS" <<'PY'
import json, re, sys
d, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, name)) if '"step"' in l]
def held(name):
    out = open("%s/%s.out" % (d, name)).read()
    m = re.search(r"experts sharded, (\d+) parameters held", out)
    return int(m.group(1)) if m else int(re.search(r"tally-train: (\d+) parameters", out).group(1))
print("%d steps of 8192 tokens (4 micro-batches of 4 x 512), 2 layers, d_model 128; "
      "times exclude the first 5 steps" % steps)
for model, title in (("dense", "dense"), ("moe", "MoE, 8 experts top-2, expert-parallel over the 2 ranks")):
    print("\n%s:\n" % title)
    print("| processes | ms/step | useful tokens/s | train loss at the last step | parameters held per process |")
    print("|---|---|---|---|---|")
    rows = {}
    for label, name in (("1 (one thread)", "one"), ("2 ranks, Gloo on loopback (one thread each)", "two-0")):
        s = load("%s-%s" % (model, name))
        t = [x["step_seconds"] for x in s[5:]]
        tok = (s[-1]["tokens"] - s[4]["tokens"]) / sum(t)
        rows[name] = sum(t) / len(t)
        print("| %s | %.1f | %.0f | %.6f | %d |" % (label, 1000 * sum(t) / len(t), tok,
                                                  s[-1]["train_loss"], held("%s-%s" % (model, name))))
    print("\nspeed-up with 2 ranks: %.2fx" % (rows["one"] / rows["two-0"]))
PY
