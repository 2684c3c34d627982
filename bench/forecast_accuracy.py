#!/usr/bin/python3
"""How good is the loss-curve forecast (server/policy/forecast.h) on real runs?

Trains a set of small CPU runs of different shapes on two corpora with the
standalone trainer (tally-train), then, for each run and each fraction in
--at (default 30%, 50% and 70% of max_steps), forecasts the final validation
loss from the evaluations seen by then with forecast_eval and compares it
with the loss the run actually ended at. Prints one Markdown table row per
run and fraction, then a summary per fraction: how often the band contained
the final loss (its coverage, against the stated --coverage, default 80%),
the signed error of the point forecast (median, and how many forecasts were
optimistic, below the final loss, or pessimistic) and the absolute error.

    bench/forecast_accuracy.py --build_dir=build [--at=0.3,0.5,0.7] [--only=1,2]

Corpora (--corpora, default demo,stdlib): `demo` is make demo's, the fortunes
package's ~15k short quotes (/usr/share/games/fortunes/*.u8); `stdlib` is
bench/corpus2.sh's, Python's standard library source, ~500 long files;
`shakespeare` is ../shared/data/tinyshakespeare.txt split at blank lines.
Each is prepared once with tally-prep under --work. Runs whose metrics file
already exists under --work are not trained again (--retrain trains them
anyway), so the forecast can be re-evaluated cheaply after a change to the
policy. The exit status is 1 when the band's coverage at some fraction is
below --coverage (--check), so the claim can be re-tested.
"""

import argparse
import concurrent.futures
import glob
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

# The shapes, run on every corpus.
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


HERE = os.path.dirname(os.path.abspath(__file__))


def prepare_corpus(name, build, work, prep_bin):
    """The dataset directory for corpus `name`, prepared under `work` once."""
    out = os.path.join(work, "data-" + name)
    if os.path.exists(os.path.join(out, "train.json")):
        return out
    if name == "demo":
        sources = sorted(glob.glob("/usr/share/games/fortunes/*.u8"))
        if not sources:
            sys.exit("forecast_accuracy: no /usr/share/games/fortunes/*.u8: install the "
                     "`fortunes` package (make demo's set-up does)")
        cmd = [prep_bin, f"--out={out}.partial"] + sources
    elif name == "shakespeare":
        cmd = [prep_bin, f"--out={out}.partial", "--split=blank",
               os.path.join(HERE, "..", "..", "shared", "data", "tinyshakespeare.txt")]
    elif name == "stdlib":
        env = dict(os.environ, TALLY_PREP=prep_bin)
        subprocess.run([os.path.join(HERE, "corpus2.sh"), out], check=True, env=env)
        return out
    else:
        sys.exit(f"forecast_accuracy: --corpora: unknown corpus {name!r} "
                 f"(known: demo, stdlib, shakespeare)")
    subprocess.run(["rm", "-rf", out + ".partial"], check=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    os.replace(out + ".partial", out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build_dir", default=os.environ.get("TALLY_BUILD_DIR", "build"))
    ap.add_argument("--corpora", default="demo,stdlib",
                    help="comma-separated: demo, stdlib, shakespeare")
    ap.add_argument("--work", default="", help="default: BUILD_DIR/forecast-bench")
    ap.add_argument("--at", default="0.3,0.5,0.7",
                    help="comma-separated fractions of max_steps to forecast at")
    ap.add_argument("--coverage", type=float, default=0.8,
                    help="the band's stated coverage, checked at every fraction")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the coverage at some fraction is below --coverage")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    ap.add_argument("--only", default="", help="comma-separated shape numbers (1-based)")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--forecast_flags", default="", help="extra flags for forecast_eval")
    args = ap.parse_args()
    try:
        fractions = [float(x) for x in args.at.split(",") if x]
    except ValueError:
        sys.exit(f"forecast_accuracy: --at: expected fractions like 0.3,0.5, got {args.at!r}")
    if not fractions or any(not 0 < f < 1 for f in fractions):
        sys.exit(f"forecast_accuracy: --at: fractions must be between 0 and 1, got {args.at!r}")

    build = os.path.abspath(args.build_dir)
    work = os.path.abspath(args.work or os.path.join(build, "forecast-bench"))
    os.makedirs(work, exist_ok=True)
    train_bin = os.path.join(build, "worker", "tally-train")
    prep_bin = os.path.join(build, "cli", "tally-prep")
    eval_bin = os.path.join(build, "bench", "forecast_eval")
    for b in (train_bin, prep_bin, eval_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"forecast_accuracy: {b} is missing; build tally-train, tally-prep and "
                     f"forecast_eval in {build}")
    corpora = [c for c in args.corpora.split(",") if c]
    data = {c: prepare_corpus(c, build, work, prep_bin) for c in corpora}

    only = {int(x) for x in args.only.split(",") if x}
    chosen = [(c, i, name, over) for c in corpora for i, (name, over) in enumerate(RUNS, 1)
              if not only or i in only]

    def train(corpus, i, name, over):
        spec = merged(BASE, over)
        spec["display_name"] = slug(name)
        spec["data"]["train_path"] = os.path.join(data[corpus], "train")
        run_dir = os.path.join(work, corpus, f"{i:02d}-{slug(name)}")
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
            print(f"# trained {corpus} {i}: {name} in {time.time() - t0:.0f} s", file=sys.stderr)
        return spec, metrics

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        trained = list(pool.map(lambda r: train(*r), chosen))

    print("| corpus | # | run | at | evals used | predicted | band | final | error | in band |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    by_fraction = {f: [] for f in fractions}
    for (corpus, i, name, _), (spec, metrics) in zip(chosen, trained):
        curve = read_curve(metrics)
        max_steps = spec["training"]["max_steps"]
        final_step, _, final = curve[-1]
        if final_step != max_steps:
            sys.exit(f"forecast_accuracy: {corpus} run {i} ended at step {final_step}, "
                     f"not {max_steps}")
        for frac in fractions:
            cut = int(frac * max_steps)
            seen = [p for p in curve if 0 < p[0] <= cut]
            if not seen:
                continue
            cut_step, cut_tokens = seen[-1][0], seen[-1][1]
            # What tallyd knows at that point: real tokens per step so far.
            tokens_per_step = cut_tokens / cut_step
            opt = spec["optimizer"]
            cmd = [eval_bin, f"--max_steps={max_steps}", f"--tokens_per_step={tokens_per_step}",
                   f"--warmup_steps={opt['warmup_steps']}",
                   f"--min_lr_ratio={opt.get('min_lr', 0) / opt['lr']}"]
            cmd += args.forecast_flags.split()
            out = subprocess.run(cmd, input="".join(f"{s} {t} {v!r}\n" for s, t, v in seen),
                                 capture_output=True, text=True, check=True).stdout
            fc = json.loads(out)
            at = f"{round(100 * frac)}% (step {cut_step})"
            if fc["status"] != "ok":
                print(f"| {corpus} | {i} | {name} | {at} | {fc['evals_used']} | - | - | "
                      f"{final:.4f} | ({fc['status']}) | - |")
                by_fraction[frac].append(None)
                continue
            err = fc["predicted"] - final
            ok = fc["low"] <= final <= fc["high"]
            by_fraction[frac].append((err, err / final, ok, final < fc["low"]))
            print(f"| {corpus} | {i} | {name} | {at} | {fc['evals_used']} | "
                  f"{fc['predicted']:.4f} | {fc['low']:.4f} to {fc['high']:.4f} | {final:.4f} | "
                  f"{err:+.4f} ({100 * err / final:+.1f}%) | {'yes' if ok else 'no'} |")

    print()
    print("| at | runs forecast | band held | coverage | signed error median | optimistic "
          "| pessimistic | abs error median | worst | final below the band |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    short = []
    for frac in fractions:
        rows = by_fraction[frac]
        done = [r for r in rows if r is not None]
        if not done:
            print(f"| {round(100 * frac)}% | 0 of {len(rows)} | - | - | - | - | - | - | - | - |")
            continue
        held = sum(r[2] for r in done)
        cov = held / len(done)
        rel = [r[1] for r in done]
        absrel = [abs(x) for x in rel]
        optimistic = sum(r[0] < 0 for r in done)
        below = sum(r[3] for r in done)
        print(f"| {round(100 * frac)}% | {len(done)} of {len(rows)} | {held} | "
              f"{100 * cov:.0f}% | {100 * statistics.median(rel):+.1f}% | {optimistic} | "
              f"{len(done) - optimistic} | {100 * statistics.median(absrel):.1f}% | "
              f"{100 * max(absrel):.1f}% | {below} |")
        if cov < args.coverage:
            short.append(f"{round(100 * frac)}%: {100 * cov:.0f}%")
    runs = len(chosen)
    print(f"\n{runs} runs on {len(corpora)} corpora ({', '.join(corpora)}); stated coverage "
          f"{100 * args.coverage:.0f}%: " + ("met at every fraction" if not short else
                                          "NOT met at " + ", ".join(short)))
    if args.check and short:
        sys.exit(1)


if __name__ == "__main__":
    main()
