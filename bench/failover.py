#!/usr/bin/python3
"""Failover time of a leader and a standby tallyd on one PostgreSQL.

  /usr/bin/python3 bench/failover.py --build_dir=build [--runs=5] [--lease_timeout=10s]

A throwaway PostgreSQL (tests/integration/postgres.py) and, per run, a fresh
database with two tallyds (--store=postgres): A leads, B stands by. A few jobs
are submitted to A, then A is killed with SIGKILL and the script measures,
from the kill:
  serving: until B's gRPC health ("") answers SERVING;
  submit:  until a SubmitJob sent to B succeeds (the first write of the new
           leader, after its recovery);
and checks every job acknowledged by A is there. Then, for comparison, a clean
SIGTERM of the leader (which releases the lease): until B serves.

The kill -9 figure is bounded by --lease_timeout (the lease must expire) plus
up to lease_timeout/5 (the standby's poll) plus recovery; SIGTERM's by the
drain plus one poll.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))


def generate_stubs():
    out = tempfile.mkdtemp(prefix="tally_bench_py_")
    protos = ["tally/v1/spec.proto", "tally/v1/jobs.proto"]
    subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                    "--python_out=" + out, "--grpc_out=" + out,
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos, check=True)
    for d in ("tally", "tally/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)


generate_stubs()
import grpc  # noqa: E402
from postgres import Postgres  # noqa: E402
from tally.v1 import jobs_pb2, jobs_pb2_grpc, spec_pb2  # noqa: E402


def serving(channel):
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda _: b"",
                                response_deserializer=lambda b: b)
    try:
        return check(None, timeout=1) == b"\x08\x01"
    except grpc.RpcError:
        return False


class Tallyd:
    def __init__(self, tallyd, work_dir, dsn, lease_timeout):
        os.makedirs(work_dir)
        self.addr_file = os.path.join(work_dir, "addr")
        self.log = open(os.path.join(work_dir, "tallyd.log"), "w")
        self.proc = subprocess.Popen(
            [tallyd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             "--address_file=" + self.addr_file, "--store=postgres", "--postgres_dsn=" + dsn,
             "--lease_timeout=" + lease_timeout, "--tick_interval=50ms"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (os.path.exists(self.addr_file) and open(self.addr_file).read()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("tallyd did not start; see " + self.log.name)
            time.sleep(0.02)
        fields = dict(kv.split("=", 1) for kv in open(self.addr_file).read().split())
        self.grpc_addr = fields["grpc"]
        self.channel = grpc.insecure_channel(self.grpc_addr)
        self.jobs = jobs_pb2_grpc.JobsStub(self.channel)

    def wait_serving(self, timeout=60):
        deadline = time.monotonic() + timeout
        while not serving(self.channel):
            if time.monotonic() > deadline:
                raise RuntimeError("%s never served; see %s" % (self.grpc_addr, self.log.name))
            time.sleep(0.005)
        return time.monotonic()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.channel.close()
        self.log.close()


def job_spec(name):
    s = spec_pb2.JobSpec(display_name=name)
    s.model.num_layers = 1
    s.model.d_model = 16
    s.model.num_heads = 2
    s.data.train_path = "/nonexistent/train"
    s.data.seq_len = 64
    s.training.micro_batch_rows = 2
    s.training.max_steps = 10
    s.resources.gpu_type = "cpu"
    s.resources.gpu_count = 1
    return s


def one_run(args, pg, work, run, how):
    dsn = pg.create_database()
    a = Tallyd(args.tallyd, os.path.join(work, "%s%d-a" % (how, run)), dsn, args.lease_timeout)
    a.wait_serving()
    b = Tallyd(args.tallyd, os.path.join(work, "%s%d-b" % (how, run)), dsn, args.lease_timeout)
    try:
        # Let the standby see the leader and the lease be renewed once.
        time.sleep(0.5)
        names = [a.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec("j%d" % i)),
                                  timeout=10).name for i in range(args.jobs)]
        t0 = time.monotonic()
        a.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        t_serving = b.wait_serving() - t0
        t_submit = None
        while t_submit is None:
            try:
                b.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=job_spec("after")), timeout=5)
                t_submit = time.monotonic() - t0
            except grpc.RpcError:
                time.sleep(0.005)
        for n in names:
            b.jobs.GetJob(jobs_pb2.GetJobRequest(name=n), timeout=10)
        return t_serving, t_submit
    finally:
        a.stop()
        b.stop()


def summary(label, values):
    return "%-30s min %6.2fs  median %6.2fs  max %6.2fs  (%s)" % (
        label, min(values), statistics.median(values), max(values),
        ", ".join("%.2f" % v for v in values))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build_dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lease_timeout", default="10s")
    p.add_argument("--jobs", type=int, default=20, help="jobs submitted before the kill")
    args = p.parse_args()
    args.tallyd = os.path.join(args.build_dir, "server", "tallyd")
    work = tempfile.mkdtemp(prefix="tally_failover_")
    with Postgres() as pg:
        results = {"kill": [], "term": []}
        for how in ("kill", "term"):
            for run in range(args.runs):
                results[how].append(one_run(args, pg, work, run, how))
                print("%s run %d: serving %.2fs, first submit %.2fs"
                      % ("kill -9" if how == "kill" else "SIGTERM", run + 1,
                         *results[how][-1]), flush=True)
    print("\nlease_timeout %s, %d runs each (logs under %s)" % (args.lease_timeout, args.runs,
                                                               work))
    print(summary("kill -9 -> standby SERVING", [r[0] for r in results["kill"]]))
    print(summary("kill -9 -> first submit", [r[1] for r in results["kill"]]))
    print(summary("SIGTERM -> standby SERVING", [r[0] for r in results["term"]]))
    print(summary("SIGTERM -> first submit", [r[1] for r in results["term"]]))


if __name__ == "__main__":
    main()
