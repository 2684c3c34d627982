#!/usr/bin/python3
"""WatchJob load on loopback: a real tallyd (SQLite in a temporary directory)
holding many idle watch streams, then live watchers on jobs whose events flow,
with concurrent submits, while a probe measures GetJob latency.

  /usr/bin/python3 bench/watch_load.py --build_dir=build

Phases (tallyd's threads and RSS from /proc/PID/status after each):
  1. start:  tallyd with its jobs submitted, nothing watching.
  2. idle:   --idle watchers on queued jobs (no worker can run them, so no
             events flow), opened from --idle_procs client processes.
  3. live:   + --live watchers on --live_jobs running jobs whose fake workers
             (this script, speaking the Workers protocol) report --eval_hz
             evaluations per job per second, each one job event; + a submitter
             (--submit_hz); GetJob p50/p99 over --seconds.
  4. after:  the live jobs finished, their watchers checked (every event, in
             order, no gap) and gone; the idle ones still open.

Python's gRPC costs far more CPU per stream than tallyd does, so the watchers
are spread over several client processes (asyncio, one event loop each). On a
small machine the clients compete with tallyd for the same cores: the GetJob
latency measured is an upper bound for tallyd's own.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate_stubs():
    out = os.environ.get("TALLY_BENCH_STUBS")
    if out and os.path.exists(os.path.join(out, "tally", "v1", "jobs_pb2.py")):
        sys.path.insert(0, out)
        return out
    out = tempfile.mkdtemp(prefix="tally_bench_py_")
    protos = ["tally/v1/spec.proto", "tally/v1/jobs.proto", "tally/v1/workers.proto"]
    subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                    "--python_out=" + out, "--grpc_out=" + out,
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos, check=True)
    for d in ("tally", "tally/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    os.environ["TALLY_BENCH_STUBS"] = out  # the client processes reuse them
    return out


def job_spec(spec_pb2, gpu_type, name):
    s = spec_pb2.JobSpec(display_name=name)
    s.model.num_layers = 1
    s.model.d_model = 16
    s.model.num_heads = 2
    s.data.train_path = "/nonexistent/bench-corpus"  # never trained: no real worker
    s.data.seq_len = 64
    s.training.micro_batch_rows = 2
    s.training.max_steps = 1000000
    s.resources.gpu_type = gpu_type
    s.resources.gpu_count = 1
    return s


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Threads", "VmRSS"):
                out[k] = int(v.split()[0])
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return {"threads": out["Threads"], "rss_mb": out["VmRSS"] / 1024.0, "cpu_s": cpu_s}


def getjob_buckets(metrics_addr):
    """tallyd's own GetJob durations: {le: cumulative count}."""
    with urllib.request.urlopen("http://%s/metrics" % metrics_addr, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if (line.startswith("grpc_server_handling_seconds_bucket{")
                and 'grpc_method="GetJob"' in line and 'grpc_service="tally.v1.Jobs"' in line):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def server_p99_bound(before, after):
    """The smallest histogram bound under which 99% of the GetJob calls
    between two scrapes finished, in ms (tallyd's own time, no client)."""
    les = sorted(after)
    total = after[les[-1]] - before.get(les[-1], 0)
    if total <= 0:
        return None
    for le in les:
        if after[le] - before.get(le, 0) >= 0.99 * total:
            return le * 1000
    return None


def channel_options():
    # One TCP connection per channel, so each process spreads its streams.
    return [("grpc.use_local_subchannel_pool", 1)]


# --------------------------------------------------------------- client roles

def idle_watchers(addr, names, per_channel, ready, stop, result):
    """Opens a watch on each name (after reading the first event, which
    proves it is open) and holds them all until `stop`."""
    generate_stubs()
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc

    async def main():
        channels, calls = [], []
        errors = 0
        t0 = time.monotonic()
        for i, name in enumerate(names):
            if i % per_channel == 0:
                channels.append(grpc.aio.insecure_channel(addr, options=channel_options()))
            stub = jobs_pb2_grpc.JobsStub(channels[-1])
            calls.append(stub.WatchJob(jobs_pb2.WatchJobRequest(name=name)))

        async def first(call):
            nonlocal errors
            try:
                await call.read()
            except grpc.RpcError:
                errors += 1

        for i in range(0, len(calls), 500):
            await asyncio.gather(*(first(c) for c in calls[i:i + 500]))
        result.put({"open_seconds": time.monotonic() - t0, "errors": errors})
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for c in calls:
            c.cancel()
        for ch in channels:
            await ch.close()

    asyncio.run(main())


def live_load(addr, names, workers, slots, watchers_per_job, eval_hz, run_seconds,
              placed, go, result):
    """Fake workers that get `names` assigned, watchers on those jobs, and
    evaluation reports at eval_hz per job; at the end each job succeeds and
    every watcher's events are checked."""
    generate_stubs()
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc, workers_pb2, workers_pb2_grpc

    async def main():
        assigned = {}  # job -> (worker queue, attempt)
        queues = []
        channel = grpc.aio.insecure_channel(addr, options=channel_options())

        async def worker(i):
            q = asyncio.Queue()
            queues.append(q)
            await q.put(workers_pb2.WorkerMessage(hello=workers_pb2.Hello(
                worker_id="bench-%d" % i, device="cpu", gpu_type="bench", slots=slots,
                version="bench")))

            async def requests():
                while True:
                    m = await q.get()
                    if m is None:
                        return
                    yield m

            call = workers_pb2_grpc.WorkersStub(channel).Connect(requests())
            try:
                async for m in call:
                    if m.HasField("assignment"):
                        assigned[m.assignment.job] = (q, m.assignment.attempt)
            except grpc.RpcError:
                pass

        async def heartbeats():
            while True:
                await asyncio.sleep(1)
                for q in queues:
                    await q.put(workers_pb2.WorkerMessage(heartbeat=workers_pb2.Heartbeat()))

        worker_tasks = [asyncio.create_task(worker(i)) for i in range(workers)]
        hb = asyncio.create_task(heartbeats())
        while len(assigned) < len(names):
            await asyncio.sleep(0.1)
        placed.set()
        while not go.is_set():
            await asyncio.sleep(0.05)

        watch_channels = [grpc.aio.insecure_channel(addr, options=channel_options())
                          for _ in range(8)]
        received = {}
        watch_errors = []

        async def watch(key, name, ch):
            got = []
            try:
                async for e in jobs_pb2_grpc.JobsStub(ch).WatchJob(
                        jobs_pb2.WatchJobRequest(name=name)):
                    got.append(e.sequence)
            except grpc.RpcError as e:
                watch_errors.append("%s: %s" % (key, e.code()))
            received[key] = (name, got)

        watches = []
        for j, name in enumerate(names):
            for k in range(watchers_per_job):
                ch = watch_channels[(j * watchers_per_job + k) % len(watch_channels)]
                watches.append(asyncio.create_task(watch((name, k), name, ch)))

        # Each job reports eval_hz times a second, the jobs spread evenly over
        # the period (workers are not synchronised).
        num_events = 0
        step = 0
        t_end = time.monotonic() + run_seconds
        jobs = list(assigned.items())
        gap = 1.0 / (eval_hz * len(jobs))
        next_send = time.monotonic()
        while time.monotonic() < t_end:
            step += 1
            for name, (q, attempt) in jobs:
                await q.put(workers_pb2.WorkerMessage(eval=workers_pb2.EvalResult(
                    job=name, attempt=attempt, step=step, tokens=step * 128,
                    val_loss=10.0 / step, bits_per_byte=1.0)))
                num_events += 1
                next_send += gap
                delay = next_send - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        for name, (q, attempt) in assigned.items():
            await q.put(workers_pb2.WorkerMessage(exit=workers_pb2.AttemptExit(
                job=name, attempt=attempt, outcome=workers_pb2.ATTEMPT_OUTCOME_SUCCEEDED,
                step=step)))
        await asyncio.wait_for(asyncio.gather(*watches), timeout=120)

        stub = jobs_pb2_grpc.JobsStub(channel)
        last = {}
        for name in names:
            job = await stub.GetJob(jobs_pb2.GetJobRequest(name=name))
            last[name] = (job.last_event_sequence, jobs_pb2.JobState.Name(job.state))
        bad = []
        delivered = 0
        for key, (name, got) in received.items():
            delivered += len(got)
            if got != list(range(1, last[name][0] + 1)):
                bad.append("%s: %d events, expected 1..%d" % (key, len(got), last[name][0]))
        for q in queues:
            await q.put(None)
        hb.cancel()
        for t in worker_tasks:
            t.cancel()
        result.put({"eval_reports": num_events, "events_delivered": delivered,
                    "watchers": len(received), "bad_watchers": bad[:5],
                    "num_bad": len(bad), "errors": watch_errors[:5],
                    "states": sorted({s for _, s in last.values()})})

    asyncio.run(main())


def submitter(addr, hz, stop, result):
    generate_stubs()
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc, spec_pb2
    stub = jobs_pb2_grpc.JobsStub(grpc.insecure_channel(addr))
    n = errors = 0
    lat = []
    next_t = time.monotonic()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            stub.SubmitJob(jobs_pb2.SubmitJobRequest(
                spec=job_spec(spec_pb2, "queued-only", "bench-submit")), timeout=10)
            n += 1
        except grpc.RpcError:
            errors += 1
        lat.append(time.perf_counter() - t0)
        next_t += 1.0 / hz
        time.sleep(max(0.0, next_t - time.monotonic()))
    result.put({"submits": n, "errors": errors, **percentiles(lat)})


def percentiles(lat):
    if not lat:
        return {}
    s = sorted(lat)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000
    return {"n": len(s), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": s[-1] * 1000}


def probe(addr, metrics_addr, names, seconds, hz):
    before = getjob_buckets(metrics_addr)
    r = probe_getjob(addr, names, seconds, hz)
    r["server_p99_le_ms"] = server_p99_bound(before, getjob_buckets(metrics_addr))
    return r


def probe_getjob(addr, names, seconds, hz):
    """GetJob on a mix of the given jobs, `hz` calls per second, one at a time."""
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc
    ch = grpc.insecure_channel(addr)
    stub = jobs_pb2_grpc.JobsStub(ch)
    stub.GetJob(jobs_pb2.GetJobRequest(name=names[0]), timeout=10)  # connect
    lat, errors = [], 0
    t_end = time.monotonic() + seconds
    i = 0
    next_t = time.monotonic()
    while time.monotonic() < t_end:
        t0 = time.perf_counter()
        try:
            stub.GetJob(jobs_pb2.GetJobRequest(name=names[i % len(names)]), timeout=10)
        except grpc.RpcError:
            errors += 1
        lat.append(time.perf_counter() - t0)
        i += 1
        next_t += 1.0 / hz
        time.sleep(max(0.0, next_t - time.monotonic()))
    ch.close()
    return {"errors": errors, **percentiles(lat)}


# ------------------------------------------------------------------ the bench

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build_dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--idle_jobs", type=int, default=1000)
    ap.add_argument("--idle_procs", type=int, default=4)
    ap.add_argument("--streams_per_channel", type=int, default=1000)
    ap.add_argument("--live", type=int, default=1000)
    ap.add_argument("--live_jobs", type=int, default=100)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--eval_hz", type=float, default=2.0)
    ap.add_argument("--submit_hz", type=float, default=20.0)
    ap.add_argument("--probe_hz", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "memory"],
                    help="tallyd's --store (sqlite: an fsync per commit, under the "
                         "scheduler's lock)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    generate_stubs()
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc, spec_pb2

    tallyd = os.path.join(args.build_dir, "server", "tallyd")
    tmp = tempfile.mkdtemp(prefix="tally_watch_bench_")
    addr_file = os.path.join(tmp, "addr")
    log = open(os.path.join(tmp, "tallyd.log"), "w")
    limit = args.idle + args.live + 100
    proc = subprocess.Popen(
        [tallyd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
         "--data_dir=" + tmp, "--address_file=" + addr_file, "--store=" + args.store,
         "--max_watch_streams_per_principal=%d" % limit, "--max_watch_streams=%d" % limit],
        stdout=log, stderr=subprocess.STDOUT)
    ctx = mp.get_context("spawn")
    children = []
    rows = []
    try:
        for _ in range(200):
            if os.path.exists(addr_file) and open(addr_file).read().strip():
                break
            time.sleep(0.05)
        fields = dict(kv.split("=", 1) for kv in open(addr_file).read().split())
        addr, metrics_addr = fields["grpc"], fields["metrics"]
        channel = grpc.insecure_channel(addr)
        stub = jobs_pb2_grpc.JobsStub(channel)

        def row(phase, **extra):
            r = {"phase": phase, **proc_status(proc.pid), **extra}
            rows.append(r)
            print("%-7s threads=%-5d rss_mb=%-8.1f %s" % (
                phase, r["threads"], r["rss_mb"],
                " ".join("%s=%s" % (k, v) for k, v in extra.items())), flush=True)

        queued = [stub.SubmitJob(jobs_pb2.SubmitJobRequest(
            spec=job_spec(spec_pb2, "queued-only", "idle-%d" % i)), timeout=10).name
            for i in range(args.idle_jobs)]
        live_jobs = [stub.SubmitJob(jobs_pb2.SubmitJobRequest(
            spec=job_spec(spec_pb2, "bench", "live-%d" % i)), timeout=10).name
            for i in range(args.live_jobs)]
        time.sleep(1)
        row("start", getjob=probe(addr, metrics_addr, queued[:50] + live_jobs[:50], 5, args.probe_hz))

        # Fake workers take the live jobs now (their watchers start later).
        placed, go = ctx.Event(), ctx.Event()
        live_result = ctx.Queue()
        slots = -(-args.live_jobs // args.workers)
        live = ctx.Process(target=live_load, args=(
            addr, live_jobs, args.workers, slots, args.live // args.live_jobs, args.eval_hz,
            args.seconds, placed, go, live_result))
        live.start()
        children.append(live)
        if not placed.wait(60):
            raise SystemExit("the fake workers did not get their jobs")

        stop_idle = ctx.Event()
        idle_results = ctx.Queue()
        per_proc = args.idle // args.idle_procs
        readies = []
        t0 = time.monotonic()
        for p in range(args.idle_procs):
            names = [queued[(p * per_proc + i) % len(queued)] for i in range(per_proc)]
            ready = ctx.Event()
            c = ctx.Process(target=idle_watchers, args=(
                addr, names, args.streams_per_channel, ready, stop_idle, idle_results))
            c.start()
            children.append(c)
            readies.append(ready)
        for r in readies:
            if not r.wait(300):
                raise SystemExit("idle watchers did not open in time")
        opened = [idle_results.get(timeout=10) for _ in readies]
        time.sleep(2)
        row("idle", watchers=per_proc * args.idle_procs,
            open_s="%.1f" % (time.monotonic() - t0),
            open_errors=sum(o["errors"] for o in opened),
            getjob=probe(addr, metrics_addr, queued[:50] + live_jobs[:50], 10, args.probe_hz))

        stop_submit = ctx.Event()
        submit_result = ctx.Queue()
        sub = ctx.Process(target=submitter, args=(addr, args.submit_hz, stop_submit,
                                                   submit_result))
        sub.start()
        children.append(sub)
        go.set()
        time.sleep(2)  # the live watchers open
        cpu_before = proc_status(proc.pid)["cpu_s"]
        t_live = time.monotonic()
        live_probe = probe(addr, metrics_addr, live_jobs[:50] + queued[:50],
                           max(1.0, args.seconds - 4), args.probe_hz)
        row("live", getjob=live_probe, tallyd_cpu_pct="%.0f" % (
            100 * (proc_status(proc.pid)["cpu_s"] - cpu_before) / (time.monotonic() - t_live)))
        stop_submit.set()
        submitted = submit_result.get(timeout=30)
        lr = live_result.get(timeout=300)
        time.sleep(2)
        row("after", live=lr, submit=submitted)
        stop_idle.set()
        for c in children:
            c.join(timeout=60)
        time.sleep(1)
        row("closed")

        print()
        print("| phase | watch streams open | tallyd threads | tallyd RSS (MB) "
              "| GetJob p50 / p99 / max, client (ms) | GetJob p99, in tallyd (ms) |")
        print("|---|---|---|---|---|---|")
        open_by_phase = {"start": 0, "idle": args.idle, "live": args.idle + args.live,
                         "after": args.idle, "closed": 0}
        for r in rows:
            g = r.get("getjob")
            lat = "%.2f / %.2f / %.2f" % (g["p50_ms"], g["p99_ms"], g["max_ms"]) if g else "-"
            server = ("<= %g" % g["server_p99_le_ms"]
                      if g and g["server_p99_le_ms"] is not None else "-")
            print("| %s | %d | %d | %.0f | %s | %s |" % (
                r["phase"], open_by_phase[r["phase"]], r["threads"], r["rss_mb"], lat, server))
        print()
        print("live: %d evaluation reports -> %d events delivered to %d watchers; "
              "%d watchers with a gap or repeat; job states %s; stream errors %s" % (
                  lr["eval_reports"], lr["events_delivered"], lr["watchers"], lr["num_bad"],
                  lr["states"], lr["errors"]))
        print("submits during the live phase: %d (p99 %.1f ms, %d errors)" % (
            submitted["submits"], submitted.get("p99_ms", 0), submitted["errors"]))
        if args.json:
            print(json.dumps(rows))
        if lr["num_bad"] or lr["errors"]:
            print("FAILED: a live watcher missed or repeated events", lr["bad_watchers"])
            return 1
        return 0
    finally:
        for c in children:
            if c.is_alive():
                c.kill()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
