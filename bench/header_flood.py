#!/usr/bin/python3
"""Oversized-header flood against a real tallyd on loopback, before and after
its transport limits (README: Transport limits).

  /usr/bin/python3 bench/header_flood.py --build_dir=build [--sizes=1,4,16]

For each of two configs, one tallyd (SQLite in a temporary directory):
  - "1.51 defaults": a --config whose grpc_server section spells out gRPC
    1.51's own defaults (what tallyd ran with before it set any limit);
  - "tallyd defaults": no grpc_server section, so tallyd's defaults.
A flooding client (its own process and connection) sends one GetJob whose
metadata holds a single header of N MiB, and times how long tallyd takes to
answer it (or until --give_up seconds, when the client cancels). gRPC 1.51
applies its header limit only once the client has acknowledged tallyd's
SETTINGS; the default client (--client=raw) never does, so its header is
decoded in full and the call reaches the handler (INVALID_ARGUMENT: the
request is empty); --client=raw-ack and --client=grpc are refused with
RESOURCE_EXHAUSTED. Meanwhile a
probe on another connection (another tenant) calls GetJob every --probe_ms
and records each call's latency; a call slower than --probe_deadline counts
as DEADLINE_EXCEEDED. Prints one markdown table: config, header size,
refusal time and code, and the probe's p50 / p99 / max and errors during the
flood (the "idle" row: the same probe with no flood).

The flood holds a core inside gRPC's HPACK parser; on a small machine the
clients share the cores with tallyd, so the figures are an upper bound.
"""

import argparse
import multiprocessing as mp
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# gRPC 1.51's own values for what tallyd now sets (grpc_types.h and
# chttp2_transport.cc of that release): 8 KiB of metadata, 16 KiB frames,
# unlimited streams, idle and age, keepalive every 2 h, pings every 5 min
# allowed, none without calls, a 120 s handshake.
LIBRARY_DEFAULTS = """grpc_server:
  max_metadata_bytes: 8192
  max_frame_bytes: 16384
  max_concurrent_streams: 2147483647
  max_receive_message_bytes: 4194304
  max_connection_idle: 0s
  max_connection_age: 0s
  keepalive_time: 2h
  keepalive_timeout: 20s
  min_client_ping_interval: 5m
  max_ping_strikes: 2
  permit_keepalive_without_calls: false
  handshake_timeout: 120s
"""


def generate_stubs():
    out = tempfile.mkdtemp(prefix="tally_bench_py_")
    protos = ["tally/v1/spec.proto", "tally/v1/jobs.proto"]
    subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                    "--python_out=" + out, "--grpc_out=" + out,
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos, check=True)
    for d in ("tally", "tally/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    return out


def own_channel(grpc, addr):
    # A connection of its own, not shared with the other client.
    return grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])


def flood(stubs, addr, mib, give_up, result):
    """One GetJob carrying a header of `mib` MiB; puts (seconds, code)."""
    sys.path.insert(0, stubs)
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc
    ch = own_channel(grpc, addr)
    stub = jobs_pb2_grpc.JobsStub(ch)
    grpc.channel_ready_future(ch).result(timeout=10)
    pad = "a" * int(mib * 1024 * 1024)
    start = time.monotonic()
    try:
        stub.GetJob(jobs_pb2.GetJobRequest(name="jobs/1"), metadata=[("x-flood", pad)],
                    timeout=give_up)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    result.put((time.monotonic() - start, code))
    ch.close()


def h2_frame(kind, flags, stream, payload):
    return (struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) +
            struct.pack(">I", stream) + payload)


def hpack_int(value, prefix_bits):
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([value])
    out = [top]
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name, value):
    # A literal header field without indexing, a new name, no Huffman coding.
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def raw_flood(addr, mib, give_up, frame_bytes, ack, result):
    """The same GetJob spoken as raw HTTP/2: one HEADERS frame and then
    CONTINUATION frames of `frame_bytes`, each written on its own, then the
    request message. With `ack` the client first acknowledges tallyd's
    SETTINGS (so its header list limit applies, as for any gRPC client);
    without, it never does, as a hostile client may. Puts (seconds, how the
    call ended)."""
    host, port = addr.rsplit(":", 1)
    block = b"".join(hpack_literal(k, v) for k, v in (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/tally.v1.Jobs/GetJob"),
        (b":authority", addr.encode()), (b"content-type", b"application/grpc"),
        (b"te", b"trailers"), (b"x-flood", b"a" * int(mib * 1024 * 1024))))
    sock = socket.create_connection((host, int(port)), timeout=give_up)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, b""))
    buf = b""

    def frames():
        nonlocal buf
        while True:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                length = int.from_bytes(buf[:3], "big")
                frame = (buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7fffffff,
                         buf[9:9 + length])
                buf = buf[9 + length:]
                yield frame
            data = sock.recv(65536)
            if not data:
                return
            buf += data

    outcome = None
    start = time.monotonic()
    try:
        incoming = frames()
        if ack:
            for kind, flags, _, _ in incoming:
                if kind == 4 and not flags & 1:
                    sock.sendall(h2_frame(4, 1, 0, b""))
                    break
        start = time.monotonic()
        chunks = [block[i:i + frame_bytes] for i in range(0, len(block), frame_bytes)]
        for i, chunk in enumerate(chunks):
            flags = 0x4 if i == len(chunks) - 1 else 0  # END_HEADERS on the last
            sock.sendall(h2_frame(1 if i == 0 else 9, flags, 1, chunk))
        # An empty request message, END_STREAM.
        sock.sendall(h2_frame(0, 1, 1, b"\x00\x00\x00\x00\x00"))
        for kind, flags, stream, payload in incoming:
            if kind == 4 and not flags & 1:
                sock.sendall(h2_frame(4, 1, 0, b"")) if ack else None
            elif kind == 1 and stream == 1:
                m = re.search(rb"grpc-status.(\d+)", payload)
                code = int(m.group(1)) if m else -1
                outcome = CODES.get(code, "grpc-status %d" % code)
                break
            elif kind == 3 and stream == 1:
                outcome = "RST_STREAM %d" % int.from_bytes(payload[:4], "big")
                break
            elif kind == 7:
                outcome = "GOAWAY"
                break
        if outcome is None:
            outcome = "connection closed"
    except socket.timeout:
        outcome = "DEADLINE_EXCEEDED"
    except OSError as e:
        outcome = "connection error (%s)" % e.__class__.__name__
    result.put((time.monotonic() - start, outcome))
    sock.close()


CODES = {0: "OK", 3: "INVALID_ARGUMENT", 5: "NOT_FOUND", 8: "RESOURCE_EXHAUSTED",
         16: "UNAUTHENTICATED"}


class Probe:
    """GetJob every `every` seconds on its own connection; latencies kept with
    their start times."""

    def __init__(self, grpc, jobs_pb2, jobs_pb2_grpc, addr, name, every, deadline):
        self.grpc, self.req = grpc, jobs_pb2.GetJobRequest(name=name)
        self.ch = own_channel(grpc, addr)
        self.stub = jobs_pb2_grpc.JobsStub(self.ch)
        self.every, self.deadline = every, deadline
        self.stub.GetJob(self.req, timeout=deadline)  # connected before it counts
        self.samples = []  # (start, seconds, ok)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.stub.GetJob(self.req, timeout=self.deadline)
                ok = True
            except self.grpc.RpcError:
                ok = False
            self.samples.append((t0, time.monotonic() - t0, ok))
            self.stop.wait(max(0.0, self.every - (time.monotonic() - t0)))

    def window(self, start, end):
        return [(s, ok) for t, s, ok in self.samples if start <= t <= end]

    def close(self):
        self.stop.set()
        self.thread.join(timeout=self.deadline + 5)
        self.ch.close()


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(samples):
    lat = [s for s, ok in samples if ok]
    errors = sum(1 for _, ok in samples if not ok)
    ms = lambda v: "%.1f" % (v * 1000)  # noqa: E731
    return (ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99)),
            ms(max(lat)) if lat else "nan", "%d/%d" % (errors, len(samples)))


def run_config(args, stubs, label, config_text):
    sys.path.insert(0, stubs)
    import grpc
    from tally.v1 import jobs_pb2, jobs_pb2_grpc, spec_pb2
    d = tempfile.mkdtemp(prefix="tally_flood_")
    config = os.path.join(d, "tallyd.yaml")
    with open(config, "w") as f:
        f.write(config_text)
    addr_file = os.path.join(d, "addr")
    log = open(os.path.join(d, "tallyd.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(args.build_dir, "server", "tallyd"), "--listen=127.0.0.1:0",
         "--metrics_listen=127.0.0.1:0", "--data_dir=" + d, "--address_file=" + addr_file,
         "--config=" + config], stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(addr_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("tallyd did not start; see " + log.name)
            time.sleep(0.05)
        with open(addr_file) as f:
            addr = dict(kv.split("=", 1) for kv in f.read().split())["grpc"]
        s = spec_pb2.JobSpec(display_name="probe")
        s.model.num_layers, s.model.d_model, s.model.num_heads = 1, 32, 2
        s.data.train_path, s.data.seq_len = "/nonexistent/probe", 64
        s.training.max_steps = 10
        s.resources.gpu_type, s.resources.gpu_count = "never", 1
        ch = own_channel(grpc, addr)
        name = jobs_pb2_grpc.JobsStub(ch).SubmitJob(
            jobs_pb2.SubmitJobRequest(spec=s), timeout=10).name
        ch.close()
        probe = Probe(grpc, jobs_pb2, jobs_pb2_grpc, addr, name, args.probe_ms / 1000.0,
                      args.probe_deadline)
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        rows.append((label, "idle", "-", "-") + summarize(probe.window(t0, time.monotonic())))
        ctx = mp.get_context("spawn")
        for mib in args.sizes:
            result = ctx.Queue()
            if args.client.startswith("raw"):
                p = ctx.Process(target=raw_flood,
                                args=(addr, mib, args.give_up, args.frame_bytes,
                                      args.client == "raw-ack", result))
            else:
                p = ctx.Process(target=flood, args=(stubs, addr, mib, args.give_up, result))
            start = time.monotonic()
            p.start()
            seconds, code = result.get(timeout=args.give_up + 60)
            end = time.monotonic()
            p.join(timeout=30)
            refused = ("> %.0f (client gave up)" % args.give_up
                       if code == "DEADLINE_EXCEEDED" else "%.3f" % seconds)
            rows.append((label, "%g MiB" % mib, refused, code) +
                        summarize(probe.window(start, end)))
            print("  %s, %g MiB: %s s, %s" % (label, mib, refused, code), file=sys.stderr)
            # Let a parse the client gave up on finish before the next size.
            time.sleep(args.settle_seconds)
        probe.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build_dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sizes", default="1,4,16",
                    help="header sizes in MiB, comma-separated (64 takes minutes on 1.51)")
    ap.add_argument("--give_up", type=float, default=60,
                    help="seconds the flooding client waits for the refusal")
    ap.add_argument("--probe_ms", type=float, default=20, help="GetJob every this many ms")
    ap.add_argument("--probe_deadline", type=float, default=30)
    ap.add_argument("--idle_seconds", type=float, default=2)
    ap.add_argument("--settle_seconds", type=float, default=2)
    ap.add_argument("--client", choices=("raw", "raw-ack", "grpc"), default="raw",
                    help="raw: HTTP/2 frames written one by one (HEADERS, then "
                    "CONTINUATION of --frame_bytes) by a client that never acknowledges "
                    "tallyd's SETTINGS; raw-ack: the same after acknowledging them; grpc: "
                    "Python gRPC's client")
    ap.add_argument("--frame_bytes", type=int, default=16384)
    ap.add_argument("--configs", default="old,new",
                    help="old: gRPC 1.51's defaults spelled out in --config; new: tallyd's")
    args = ap.parse_args()
    args.sizes = [float(x) for x in args.sizes.split(",") if x]
    stubs = generate_stubs()
    configs = {"1.51 defaults": LIBRARY_DEFAULTS, "tallyd defaults": ""}
    chosen = {"old": "1.51 defaults", "new": "tallyd defaults"}
    rows = []
    for key in args.configs.split(","):
        label = chosen[key]
        rows += run_config(args, stubs, label, configs[label])
    print("| config | header | answered after (s) | how it ended | GetJob p50 (ms) | p99 (ms) "
          "| max (ms) | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
