#!/usr/bin/python3
"""How good is the loss-curve forecast (server/policy/forecast.h) on real runs?

Trains a set of small CPU runs of different shapes with the standalone
trainer (tally-train), then, for each, forecasts the final validation loss
from the evaluations up to --at x max_steps with forecast_eval and compares
it with the loss the run actually ended at. Prints one Markdown table row per
run and a summary (median and worst absolute and relative error, and how
often the band contained the final loss).

    bench/forecast_accuracy.py --build_dir=build [--at=0.3] [--only=NAME,...]

The dataset is prepared once with tally-prep from --corpus (blank-line
documents) under --work. Runs whose metrics file already exists under --work
are not trained again (--retrain trains them anyway), so the forecast can be
re-evaluated cheaply after a change to the policy.
"""

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import time

# Every run: 400 steps, evaluated every 10 (41 evaluations), cosine to
# min_lr, on byte-level Shakespeare. Overrides per shape below.
BASE = {
    "model": {"num_layers": 2, "d_model": 64, "num_heads": 4},
    "data": {"seq_len": 128, "packing": "packed"},
    "training": {"max_steps": 400, "micro_batch_rows": 8, "eval_interval_steps": 10,
                 "eval_tokens": 8192, "checkpoint_interval_steps": 0, "seed": 1},
    "optimizer": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20, "grad_clip": 1.0},
    "resources": {"gpu_type": "cpu", "gpu_count": 1},
}

RUNS = [
    ("dense L2 d64, lr 3e-3, packed", {}),
    ("dense L3 d96, lr 2e-3, packed",
     {"model": {"num_layers": 3, "d_model": 96, "num_heads": 4},
      "optimizer": {"lr": 2e-3, "min_lr": 2e-4}}),
    ("dense L2 d64, lr 5e-4 (slow)", {"optimizer": {"lr": 5e-4, "min_lr": 5e-5}}),
    ("dense L2 d64, lr 1e-2 (hot)", {"optimizer": {"lr": 1e-2, "min_lr": 1e-3}}),
    ("dense L1 d192, lr 3e-3", {"model": {"num_layers": 1, "d_model": 192, "num_heads": 6}}),
    ("dense L2 d64, pad_to_seq_len", {"data": {"packing": "pad_to_seq_len"}}),
    ("dense L2 d64, pad_to_longest, seq 256",
     {"data": {"packing": "pad_to_longest", "seq_len": 256}}),
    ("dense L2 d64, warmup 60, min_lr 0",
     {"optimizer": {"warmup_steps": 60, "min_lr": 0}}),
    ("MoE L2 d64, 4 experts top-2", {"model": {"moe": {
        "num_experts": 4, "top_k": 2, "every_n_layers": 1, "aux_loss_coef": 0.01}}}),
    ("MoE L3 d64, 8 experts top-2 + shared, every 2nd",
     {"model": {"num_layers": 3, "moe": {
         "num_experts": 8, "top_k": 2, "every_n_layers": 2, "shared_expert": True,
         "aux_loss_coef": 0.01, "bias_balancing": True}}}),
]


def merged(base, over):
    out = json.loads(json.dumps(base))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def slug(name):
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:60]


def read_curve(metrics_path):
    """(step, tokens, val_loss) per evaluation; tokens from the step lines."""
    tokens_at = {0: 0}
    evals = []
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            if "eval_step" in rec:
                evals.append((rec["eval_step"], rec["val_loss"]))
            elif "step" in rec:
                tokens_at[rec["step"]] = rec["tokens"]
    return [(s, tokens_at[s], v) for s, v in evals if s in tokens_at]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build_dir", default=os.environ.get("TALLY_BUILD_DIR", "build"))
    ap.add_argument("--corpus", default="/work/shared/data/tinyshakespeare.txt")
    ap.add_argument("--work", default="", help="default: BUILD_DIR/forecast-bench")
    ap.add_argument("--at", type=float, default=0.3, help="forecast at this fraction of max_steps")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    ap.add_argument("--only", default="", help="comma-separated run numbers (1-based)")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--forecast_flags", default="", help="extra flags for forecast_eval")
    args = ap.parse_args()

    build = os.path.abspath(args.build_dir)
    work = os.path.abspath(args.work or os.path.join(build, "forecast-bench"))
    os.makedirs(work, exist_ok=True)
    train_bin = os.path.join(build, "worker", "tally-train")
    prep_bin = os.path.join(build, "cli", "tally-prep")
    eval_bin = os.path.join(build, "server", "policy", "forecast_eval")
    for b in (train_bin, prep_bin, eval_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"forecast_accuracy: {b} is missing; build tally-train, tally-prep and "
                     f"forecast_eval in {build}")
    data = os.path.join(work, "data")
    if not os.path.exists(os.path.join(data, "train.json")):
        subprocess.run([prep_bin, f"--out={data}", "--split=blank", args.corpus], check=True)

    only = {int(x) for x in args.only.split(",") if x}
    chosen = [(i, name, over) for i, (name, over) in enumerate(RUNS, 1) if not only or i in only]

    def train(i, name, over):
        spec = merged(BASE, over)
        spec["display_name"] = slug(name)
        spec["data"]["train_path"] = os.path.join(data, "train")
        run_dir = os.path.join(work, f"{i:02d}-{slug(name)}")
        os.makedirs(run_dir, exist_ok=True)
        spec_path = os.path.join(run_dir, "job.json")
        metrics = os.path.join(run_dir, "metrics.jsonl")
        with open(spec_path, "w") as f:
            json.dump(spec, f, indent=1)
        if args.retrain or not os.path.exists(metrics):
            t0 = time.time()
            with open(os.path.join(run_dir, "train.log"), "w") as log:
                subprocess.run([train_bin, f"--spec={spec_path}", f"--metrics_out={metrics}.tmp",
                                f"--threads={args.threads}", "--log_every=100"],
                               stdout=log, stderr=subprocess.STDOUT, check=True)
            os.replace(metrics + ".tmp", metrics)
            print(f"# trained {i}: {name} in {time.time() - t0:.0f} s", file=sys.stderr)
        return spec, metrics

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        trained = list(pool.map(lambda r: train(*r), chosen))

    rows = []
    for (i, name, _), (spec, metrics) in zip(chosen, trained):
        curve = read_curve(metrics)
        max_steps = spec["training"]["max_steps"]
        final_step, _, final = curve[-1]
        if final_step != max_steps:
            sys.exit(f"forecast_accuracy: run {i} ended at step {final_step}, not {max_steps}")
        cut = int(args.at * max_steps)
        seen = [p for p in curve if p[0] <= cut]
        cut_step, cut_tokens = seen[-1][0], seen[-1][1]
        # What tallyd knows at that point: real tokens per step so far.
        tokens_per_step = cut_tokens / cut_step
        opt = spec["optimizer"]
        cmd = [eval_bin, f"--max_steps={max_steps}", f"--tokens_per_step={tokens_per_step}",
               f"--warmup_steps={opt['warmup_steps']}",
               f"--min_lr_ratio={opt.get('min_lr', 0) / opt['lr']}"] + args.forecast_flags.split()
        out = subprocess.run(cmd, input="".join(f"{s} {t} {v!r}\n" for s, t, v in seen),
                             capture_output=True, text=True, check=True).stdout
        fc = json.loads(out)
        rows.append((i, name, cut_step, fc, final))

    print("| # | run | forecast at step | evals used | predicted | band | final | error "
          "| in band |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs, rels, inside, n_ok = [], [], 0, 0
    for i, name, cut_step, fc, final in rows:
        if fc["status"] != "ok":
            print(f"| {i} | {name} | {cut_step} | {fc['evals_used']} | - | - | {final:.4f} | "
                  f"({fc['status']}) | - |")
            continue
        n_ok += 1
        err = fc["predicted"] - final
        ok = fc["low"] <= final <= fc["high"]
        inside += ok
        errs.append(abs(err))
        rels.append(abs(err) / final)
        print(f"| {i} | {name} | {cut_step} | {fc['evals_used']} | {fc['predicted']:.4f} | "
              f"{fc['low']:.4f} to {fc['high']:.4f} | {final:.4f} | {err:+.4f} "
              f"({100 * err / final:+.1f}%) | {'yes' if ok else 'no'} |")
    if errs:
        print(f"\n{n_ok} of {len(rows)} runs forecast; absolute error median "
              f"{statistics.median(errs):.4f}, worst {max(errs):.4f}; relative median "
              f"{100 * statistics.median(rels):.1f}%, worst {100 * max(rels):.1f}%; "
              f"the band contained the final loss in {inside} of {n_ok}")


if __name__ == "__main__":
    main()
