#!/usr/bin/python3
"""What a SIGTERM mid-job costs, two builds side by side in one run: each
build's tallyd and tally-worker (real processes on loopback, CPU) train the
same job, which checkpoints every --interval steps; once it has passed
--at steps, the worker gets SIGTERM (as Kubernetes evicts a pod), a second
worker joins, and the job's next attempt starts. Per build, per round:

  exit_s       seconds from SIGTERM to the worker's exit
  stopped      the step the job had reached (its latest report)
  resumed      the step the next attempt resumed from
  redone       steps the next attempt trains again (stopped - resumed)
  redone_usd   dollars charged for them (lost_usd + redone_usd, at $36/GPU-hour)
  counted      whether the attempt counted against max_attempts

  /usr/bin/python3 bench/preemption_notice.py --old=OLD_BUILD --new=NEW_BUILD

A build dir holds server/tallyd, worker/tally-worker (and cli/tally-prep for
the corpus, taken from --new). An older checkout's build, e.g.:
  git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/old/build -G Ninja \\
    -DTALLY_LIBTORCH_DIR=... && cmake --build /tmp/old/build --target tallyd tally-worker
"""

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="build dir of the first build")
    p.add_argument("--new", required=True, help="build dir of the second build")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interval", type=int, default=500, help="checkpoint_interval_steps")
    p.add_argument("--at", type=int, default=900, help="SIGTERM once past this step")
    args = p.parse_args()
    for b in (args.old, args.new):
        for t in ("server/tallyd", "worker/tally-worker"):
            if not os.access(os.path.join(b, t), os.X_OK):
                sys.exit("%s/%s: not built" % (b, t))
    os.environ["TALLY_BUILD_DIR"] = os.path.abspath(args.new)
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import harness  # noqa: E402  (generates the stubs, prepares the corpus)
    from harness import jobs_pb2, spec, wait_for  # noqa: E402

    resume_re = re.compile(r"resuming from step (\d+)")

    def one(label, build):
        harness.TALLYD = os.path.join(build, "server", "tallyd")
        harness.WORKER = os.path.join(build, "worker", "tally-worker")
        d = tempfile.mkdtemp(prefix="tally_bench_preempt_")
        try:
            config = os.path.join(d, "tallyd.yaml")
            with open(config, "w") as f:
                f.write("usd_per_gpu_hour: {cpu: 36.0}\n")
            tallyd = harness.Tallyd(d, extra_args=["--config=" + config])
            workers = [harness.Worker(tallyd.grpc_addr, "w1", d)]
            try:
                s = spec(max_steps=1000000, name="bench", checkpoint_interval=args.interval)
                s.training.eval_interval_steps = 0
                job = tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=s), timeout=10)

                def get():
                    return tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=job.name), timeout=10)
                wait_for(lambda: get().step >= args.at, timeout=300, what="step %d" % args.at)
                t0 = time.monotonic()
                workers[0].proc.send_signal(signal.SIGTERM)
                workers[0].proc.wait(timeout=120)
                exit_s = time.monotonic() - t0
                stopped = get().step
                workers.append(harness.Worker(tallyd.grpc_addr, "w2", d))
                j = wait_for(lambda: (lambda j: j if j.attempt >= 2 and
                                      j.state == jobs_pb2.JOB_STATE_RUNNING else None)(get()),
                             timeout=120, what="the second attempt")
                resumed = 0
                events = tallyd.jobs.WatchJob(jobs_pb2.WatchJobRequest(name=job.name),
                                              timeout=3)
                try:
                    for e in events:
                        if e.type == "started":
                            m = resume_re.search(e.detail)
                            resumed = int(m.group(1)) if m else 0
                except Exception:  # the watch of a running job ends at its deadline
                    pass
                cost = j.cost
                redone_usd = cost.lost_usd + getattr(cost, "redone_usd", 0.0)
                counted = "no" if j.preemption.count > 0 else "yes"
                tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name), timeout=10)
                return (label, exit_s, stopped, resumed, stopped - resumed, redone_usd, counted)
            finally:
                for w in workers:
                    w.kill()
                tallyd.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    print("build\texit_s\tstopped\tresumed\tredone\tredone_usd\tcounted")
    for _ in range(args.rounds):
        for label, build in (("old", args.old), ("new", args.new)):
            r = one(label, build)
            print("%s\t%.2f\t%d\t%d\t%d\t%.4f\t%s" % r, flush=True)


if __name__ == "__main__":
    main()
