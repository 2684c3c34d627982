"""Real tallyd and tally-worker processes on loopback, and a Python gRPC client
whose stubs are generated from proto/ at test time (Debian's python3-grpcio).

TALLY_TEST_STORE=postgres runs every Tallyd the tests start (unless its
arguments pick a --store themselves) on PostgreSQL: one server for the test
module's process (postgres.py, started on first use, removed at exit) and a
fresh database per tallyd data directory, kept across restarts as the SQLite
file would be. Such a tallyd leads only once it holds the lease
(--lease_timeout, TALLY_TEST_LEASE_TIMEOUT, default 3s): start() waits for
/readyz, so after a kill -9 it returns once the old lease has expired.
Unset, or sqlite, keeps the default store."""

import atexit
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("TALLY_BUILD_DIR", os.path.join(ROOT, "build"))
TALLYD = os.path.join(BUILD, "server", "tallyd")
WORKER = os.path.join(BUILD, "worker", "tally-worker")
TALLYCTL = os.path.join(BUILD, "cli", "tallyctl")
TALLY_PREP = os.path.join(BUILD, "cli", "tally-prep")
TALLY_TRAIN = os.path.join(BUILD, "worker", "tally-train")
FORTUNES = "/usr/share/games/fortunes"
STORE = os.environ.get("TALLY_TEST_STORE", "sqlite") or "sqlite"
if STORE not in ("sqlite", "postgres"):
    raise SystemExit("TALLY_TEST_STORE: must be sqlite or postgres, got %r" % STORE)
PG_LEASE_TIMEOUT = os.environ.get("TALLY_TEST_LEASE_TIMEOUT", "3s")


def _generate_stubs():
    out = tempfile.mkdtemp(prefix="tally_py_")
    protos = ["tally/v1/spec.proto", "tally/v1/jobs.proto", "tally/v1/workers.proto",
              "tally/v1/experiments.proto"]
    subprocess.run(
        ["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
         "--python_out=" + out, "--grpc_out=" + out,
         "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos,
        check=True)
    for d in ("tally", "tally/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)


_generate_stubs()


def _prepare_corpus():
    """A real corpus for the workers: seven fortune files (scripts/setup.sh
    installs the fortunes package), tokenized by tally-prep."""
    out = tempfile.mkdtemp(prefix="tally_corpus_")
    files = [os.path.join(FORTUNES, f + ".u8") for f in
             ("fortunes", "literature", "science", "people", "wisdom", "humorists", "computers")]
    subprocess.run([TALLY_PREP, "--out=" + out] + files, check=True, capture_output=True)
    return os.path.join(out, "train")


TRAIN_PATH = _prepare_corpus()
import grpc  # noqa: E402
from tally.v1 import jobs_pb2, jobs_pb2_grpc, spec_pb2  # noqa: E402,F401
from tally.v1 import experiments_pb2, experiments_pb2_grpc  # noqa: E402,F401

TERMINAL = {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_EARLY_STOPPED,
            jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED, jobs_pb2.JOB_STATE_CANCELLED,
            jobs_pb2.JOB_STATE_FAILED}


def test_failed(test):
    """Whether `test` (a unittest.TestCase in its tearDown) has failed or
    raised so far: its logs are then worth printing."""
    outcome = getattr(test, "_outcome", None)
    result = getattr(outcome, "result", None)
    return (not getattr(outcome, "success", True)) or (
        result is not None and any(t is test for t, _ in result.errors + result.failures))


def wait_for(predicate, timeout=30.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out after %.0fs waiting for %s" % (timeout, what))


def parse_exposition(text):
    """Prometheus text exposition -> {'name{labels}': value}."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        series[key] = float(value)
    return series


def metric_value(text, name, **labels):
    """The value of the first series of `name` in exposition `text` whose
    labels include `labels`; None when there is none."""
    for key, value in parse_exposition(text).items():
        n, _, rest = key.partition("{")
        have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if n == name and all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


def events_so_far(jobs, name):
    """The job's events up to its latest now, from a Jobs stub (a watch cut
    short there)."""
    job = jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10)
    out = []
    stream = jobs.WatchJob(jobs_pb2.WatchJobRequest(name=name), timeout=30)
    for e in stream:
        out.append(e)
        if e.sequence >= job.last_event_sequence:
            break
    stream.cancel()
    return out


def _read(path):
    with open(path) as f:
        return f.read()


_postgres = None
_databases = {}  # tallyd data directory -> DSN of its database


def postgres_server():
    """This process's PostgreSQL server, started on first use (a test
    module runs in a process of its own under ctest)."""
    global _postgres
    if _postgres is None:
        from postgres import Postgres
        _postgres = Postgres()
    return _postgres


def postgres_database(data_dir):
    """The database of the tallyd whose data directory is `data_dir`: a
    fresh one the first time, the same one after (a restart, or a new
    Tallyd on the same directory, finds its data as with SQLite)."""
    key = os.path.realpath(data_dir)
    if key not in _databases:
        _databases[key] = postgres_server().create_database()
    return _databases[key]


def _bytes_or_text(field):
    # psql prints bytea as \x followed by hex (bytea_output=hex, the default).
    return bytes.fromhex(field[2:]) if field.startswith("\\x") else field


class Tallyd:
    """One tallyd process; restart() keeps its data directory. With ca_cert
    the client speaks TLS and trusts that CA; with token it sends it as a
    bearer token on every call."""

    def __init__(self, data_dir, extra_args=(), ca_cert=None, token=None):
        self.data_dir = data_dir
        self.extra_args = list(extra_args)
        self.ca_cert = ca_cert
        self.token = token
        self.proc = None
        self.log_path = os.path.join(data_dir, "tallyd.log")
        # TALLY_TEST_STORE=postgres: a database of its own, unless the test
        # chose a store (test_ha runs leaders and standbys by hand).
        self.dsn = None
        if STORE == "postgres" and not any(a.startswith("--store") for a in self.extra_args):
            self.dsn = postgres_database(data_dir)
        self.start()

    @property
    def store_args(self):
        if self.dsn is None:
            return []
        return ["--store=postgres", "--postgres_dsn=" + self.dsn,
                "--lease_timeout=" + PG_LEASE_TIMEOUT]

    def start(self):
        addr_file = os.path.join(self.data_dir, "addr")
        if os.path.exists(addr_file):
            os.unlink(addr_file)
        # Reuse the previous ports on restart so workers find it again.
        listen = getattr(self, "grpc_addr", "127.0.0.1:0")
        metrics = getattr(self, "metrics_addr", "127.0.0.1:0")
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [TALLYD, "--listen=" + listen, "--metrics_listen=" + metrics,
             "--data_dir=" + self.data_dir, "--address_file=" + addr_file,
             "--heartbeat_interval=300ms", "--heartbeat_timeout=3s",
             "--tick_interval=50ms"] + self.store_args + self.extra_args,
            stdout=self.log, stderr=subprocess.STDOUT)
        _STARTED.append(self.proc)
        text = wait_for(lambda: self._exited_early() or
                        (os.path.exists(addr_file) and _read(addr_file)),
                        what="tallyd to write its address")
        fields = dict(kv.split("=", 1) for kv in text.split())
        self.grpc_addr, self.metrics_addr = fields["grpc"], fields["metrics"]
        if self.dsn is not None:
            # A standby writes its address at once; wait until it leads
            # (the lease of a tallyd killed before it must expire first).
            wait_for(lambda: self._exited_early() or self.ready(), timeout=90, interval=0.05,
                     what="tallyd on PostgreSQL to take the leader lease (/readyz 200)")
        self.channel = self.open_channel(self.token)
        self.jobs = jobs_pb2_grpc.JobsStub(self.channel)
        self.experiments = experiments_pb2_grpc.ExperimentsStub(self.channel)

    def open_channel(self, token=None, ca_cert=None):
        """A channel to this tallyd: TLS when it has a CA (or ca_cert is
        given), sending `token` as a bearer token when given."""
        ca_cert = ca_cert or self.ca_cert
        if ca_cert is None:
            channel = grpc.insecure_channel(self.grpc_addr)
            if token:
                channel = grpc.intercept_channel(channel, BearerInterceptor(token))
            return channel
        with open(ca_cert, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(self.grpc_addr, creds)

    def _exited_early(self):
        code = self.proc.poll()
        if code is not None:
            self.log.flush()
            raise AssertionError("tallyd exited with code %d while starting:\n%s"
                                 % (code, self.logs()[-4000:]))
        return False

    def ready(self):
        """Whether /readyz answers 200 (a leader; a standby answers 503)."""
        try:
            with urllib.request.urlopen("http://%s/readyz" % self.metrics_addr, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, sql):
        """Rows of `sql` run on this tallyd's store, read-only: its SQLite file,
        or its PostgreSQL database (bytea columns come back as bytes, others as
        text). The tables are the same in both (server/store)."""
        if self.dsn is None:
            db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.data_dir, "tally.db"),
                                 uri=True)
            try:
                return [tuple(row) for row in db.execute(sql)]
            finally:
                db.close()
        dbname = self.dsn.rsplit("dbname=", 1)[1]
        out = postgres_server().psql(sql, dbname=dbname)
        return [tuple(_bytes_or_text(f) for f in line.split("|"))
                for line in out.splitlines() if line]

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.channel.close()
        self.log.close()
        return code

    def restart(self):
        self.kill()
        self.start()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.kill(signal.SIGTERM)

    def scrape(self):
        with urllib.request.urlopen("http://%s/metrics" % self.metrics_addr, timeout=5) as r:
            return r.read().decode()

    def logs(self):
        with open(self.log_path) as f:
            return f.read()


# Every tallyd a test started: one a test forgot to stop is killed when the
# test process exits (a leader whose database went away waits for it,
# refusing calls, instead of exiting).
_STARTED = []


@atexit.register
def _kill_leftover_tallyds():
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


class BearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call of a plaintext
    channel (gRPC's call credentials need TLS)."""

    def __init__(self, token):
        self.token = token

    def _details(self, details):
        metadata = list(details.metadata or []) + [("authorization", "Bearer " + self.token)]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A tally-worker on one CPU thread; workers of a test share a checkpoint
    directory, as workers on shared storage do, and each has its own
    rendezvous port on loopback for multi-GPU attempts it leads. start()
    after kill() runs it again with the same flags (worker id, checkpoint
    directory, rendezvous port)."""

    def __init__(self, controller, worker_id, log_dir, extra_args=()):
        self.worker_id = worker_id
        self.log_path = os.path.join(log_dir, "worker-%s.log" % worker_id)
        self.args = ([WORKER, "--controller=" + controller, "--worker_id=" + worker_id,
                      "--threads=1", "--checkpoint_dir=" + os.path.join(log_dir, "checkpoints"),
                      "--rendezvous_host=127.0.0.1", "--rendezvous_port=%d" % free_port(),
                      "--collective_timeout=30"]
                     + list(extra_args))
        self.start()

    def start(self):
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.log.close()
        return code


def spec(max_steps=20, priority=0, name="test", gpu_type="cpu", gpu_count=1,
         max_attempts=3, checkpoint_interval=0):
    """A very small model on the real corpus: a few milliseconds a step."""
    s = spec_pb2.JobSpec(display_name=name, priority=priority, max_attempts=max_attempts)
    s.model.num_layers = 1
    s.model.d_model = 16
    s.model.num_heads = 2
    s.data.train_path = TRAIN_PATH
    s.data.seq_len = 64
    s.training.micro_batch_rows = 2
    s.training.max_steps = max_steps
    s.training.checkpoint_interval_steps = checkpoint_interval
    s.training.seed = 1
    s.resources.gpu_type = gpu_type
    s.resources.gpu_count = gpu_count
    return s


class ClusterTest(unittest.TestCase):
    """Starts a fresh tallyd per test; workers via add_worker()."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_it_")
        self.tallyd = Tallyd(self.dir)
        self.workers = []

    def tearDown(self):
        for w in self.workers:
            w.kill()
        self.tallyd.stop()
        if test_failed(self):
            print("--- tallyd log ---\n" + self.tallyd.logs(), file=sys.stderr)
            for w in self.workers:
                with open(w.log_path) as f:
                    print("--- %s log ---\n%s" % (w.worker_id, f.read()), file=sys.stderr)
            if _postgres is not None:
                print("--- postgres log (tail) ---\n" + _postgres.logs()[-6000:],
                      file=sys.stderr)

    def add_worker(self, worker_id, extra_args=()):
        w = Worker(self.tallyd.grpc_addr, worker_id, self.dir, extra_args)
        self.workers.append(w)
        return w

    def submit(self, s=None, request_id=""):
        return self.tallyd.jobs.SubmitJob(
            jobs_pb2.SubmitJobRequest(spec=s or spec(), request_id=request_id), timeout=10)

    def get(self, name):
        return self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10)

    def wait_state(self, name, states, timeout=30):
        if isinstance(states, int):
            states = {states}
        return wait_for(lambda: (lambda j: j if j.state in states else None)(self.get(name)),
                        timeout=timeout,
                        what="%s to reach %s" % (name, [jobs_pb2.JobState.Name(s) for s in states]))

    def metric(self, name, **labels):
        return metric_value(self.tallyd.scrape(), name, **labels)

    def events(self, name, after=0):
        return list(self.tallyd.jobs.WatchJob(
            jobs_pb2.WatchJobRequest(name=name, after_sequence=after), timeout=60))

    def tallyctl(self, *args, stdin=None):
        env = dict(os.environ, TALLY_CONTROLLER=self.tallyd.grpc_addr)
        return subprocess.run([TALLYCTL] + list(args), capture_output=True, text=True,
                              env=env, input=stdin, timeout=120)
