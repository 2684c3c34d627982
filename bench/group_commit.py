#!/usr/bin/env python3
"""Group commit, side by side in one run: tallyd with --group_commit=false
(one transaction and fsync per submit, under the scheduler lock) and with
--group_commit=true (concurrent submits share a transaction), each under the
same bench/submit_bench load at 1, 8 and 64 clients. Prints one markdown
table: store, path, clients, acknowledged submits/s, p50 and p99 latency.

    bench/group_commit.py [--build_dir=build] [--seconds=4] [--clients=1,8,64]
                          [--stores=sqlite,postgres,memory] [--postgres_dsn=DSN]

Every row starts a fresh tallyd on loopback with an empty store. SQLite keeps
its defaults (WAL, synchronous=FULL) in a temporary --data_dir. The memory
store (no disk at all) is the ceiling the controller and gRPC allow on this
machine.

PostgreSQL rows (tallyd --store=postgres) need a server. With --postgres_dsn
(or $TALLY_BENCH_POSTGRES_DSN) every row uses that database (the jobs of
earlier rows stay in it; each tallyd waits for the leader lease the previous
one released). Without one, a throwaway server is started with
tests/integration/postgres.py, fsync on (as a production server runs), and
each row gets a fresh database. Where no PostgreSQL is installed the
PostgreSQL rows are skipped with a note.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for " + what)


def ready(metrics_addr):
    try:
        with urllib.request.urlopen("http://%s/readyz" % metrics_addr, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def run_row(args, store, group_commit, clients, dsn):
    d = tempfile.mkdtemp(prefix="tally_gc_bench_")
    cmd = [os.path.join(args.build_dir, "server", "tallyd"),
           "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
           "--store=" + store, "--data_dir=" + d,
           "--address_file=" + os.path.join(d, "addr"),
           "--group_commit=" + ("true" if group_commit else "false")]
    if store == "postgres":
        cmd += ["--postgres_dsn=" + dsn, "--lease_timeout=3s"]
    log = open(os.path.join(d, "log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        addr_file = os.path.join(d, "addr")
        wait_for(lambda: os.path.exists(addr_file) and os.path.getsize(addr_file) > 0
                 or proc.poll() is not None, 30, "tallyd's address file")
        if proc.poll() is not None:
            raise RuntimeError("tallyd exited (%s):\n%s" % (
                proc.returncode, open(os.path.join(d, "log")).read()[-3000:]))
        fields = dict(f.split("=", 1) for f in open(addr_file).read().split())
        wait_for(lambda: ready(fields["metrics"]), 30, "tallyd to lead (/readyz 200)")
        out = subprocess.run(
            [os.path.join(args.build_dir, "bench", "submit_bench"),
             "--controller=" + fields["grpc"], "--clients=%d" % clients,
             "--seconds=%g" % args.seconds],
            capture_output=True, text=True, timeout=args.seconds + 120)
        cols = out.stdout.split()
        if len(cols) < 6:
            raise RuntimeError("submit_bench printed %r (stderr %r)" % (out.stdout, out.stderr))
        # clients, submits, submits/s, p50 ms, p99 ms, errors
        return {"per_s": float(cols[2]), "p50": float(cols[3]), "p99": float(cols[4]),
                "errors": int(cols[5])}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build_dir", default=os.environ.get("TALLY_BUILD_DIR",
                                                         os.path.join(REPO, "build")))
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--stores", default="sqlite,postgres,memory")
    p.add_argument("--postgres_dsn", default=os.environ.get("TALLY_BENCH_POSTGRES_DSN", ""))
    args = p.parse_args()
    for t in ("server/tallyd", "bench/submit_bench"):
        if not os.access(os.path.join(args.build_dir, t), os.X_OK):
            sys.exit("%s/%s: not built (cmake --build %s --target tallyd submit_bench)"
                     % (args.build_dir, t, args.build_dir))
    clients = [int(c) for c in args.clients.split(",")]
    stores = args.stores.split(",")
    notes = []
    pg = None
    if "postgres" in stores and not args.postgres_dsn:
        sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
        try:
            from postgres import Postgres
            pg = Postgres(fsync=True)
        except Exception as e:  # unittest.SkipTest where none is installed
            notes.append("PostgreSQL rows skipped: %s" % e)
            stores.remove("postgres")

    rows = []
    load_before = os.getloadavg()[0]
    try:
        for store in stores:
            for c in clients:
                for gc in (False, True):
                    dsn = args.postgres_dsn
                    if store == "postgres" and pg is not None:
                        dsn = pg.create_database()
                    r = run_row(args, store, gc, c, dsn)
                    rows.append((store, gc, c, r))
                    print("%s group_commit=%s clients=%d: %.0f/s p50 %.2f ms p99 %.2f ms%s" % (
                        store, gc, c, r["per_s"], r["p50"], r["p99"],
                        " (%d errors)" % r["errors"] if r["errors"] else ""),
                        file=sys.stderr, flush=True)
    finally:
        if pg is not None:
            pg.close()

    print("| store | path | clients | submits/s | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for store, gc, c, r in rows:
        path = "group commit" if gc else "one commit per submit"
        err = " (%d errors)" % r["errors"] if r["errors"] else ""
        print("| %s | %s | %d | %.0f%s | %.2f | %.2f |" % (
            store, path, c, r["per_s"], err, r["p50"], r["p99"]))
    notes.append("%g-second rows, %d CPUs, load average %.1f before and %.1f after." % (
        args.seconds, os.cpu_count(), load_before, os.getloadavg()[0]))
    for n in notes:
        print("\n" + n)


if __name__ == "__main__":
    main()
