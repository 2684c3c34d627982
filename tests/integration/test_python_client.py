"""The Python client package (python/, import name tally) against a real
tallyd over TLS with tokens and two tenants, and real CPU workers: the
installed package's messages match proto/, the connection is resolved as
tallyctl resolves it, submit -> watch -> done, a watch resumed across a
tallyd restart, paging over 1,000 jobs, refused tokens and other tenants'
jobs, an experiment to its table, DataFrame and plot, the asyncio client,
and examples/python (the script and the notebook).

Run by the virtual environment scripts/setup.sh makes (TALLY_PYTHON_VENV)
with the package installed (the python.install test)."""

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

# The package first: harness.py's own stubs (tally.v1 from a temporary
# folder) then resolve to the package's modules of the same names.
import tally  # noqa: E402
import tally.aio  # noqa: E402
from tally.v1 import experiments_pb2 as pkg_experiments_pb2  # noqa: E402
from tally.v1 import jobs_pb2 as pkg_jobs_pb2  # noqa: E402

from harness import (ROOT, TALLYCTL, TRAIN_PATH, Tallyd, Worker, wait_for)  # noqa: E402
from test_security import Pki, secure_args  # noqa: E402

PRICE = 36.0  # $ per GPU-hour: a cpu second costs a cent
PROTOS = ["tally/v1/spec.proto", "tally/v1/jobs.proto", "tally/v1/experiments.proto",
          "tally/v1/workers.proto", "tally/v1/auth_config.proto"]
EXAMPLES = os.path.join(ROOT, "examples", "python")


def tiny(max_steps=20, name="py", gpu_type="cpu", eval_every=0):
    """A very small model on the real corpus, as a dict (submit's dict form)."""
    return {"display_name": name,
            "model": {"num_layers": 1, "d_model": 16, "num_heads": 2},
            "data": {"train_path": TRAIN_PATH, "seq_len": 64, "packing": "packed"},
            "training": {"max_steps": max_steps, "micro_batch_rows": 2, "seed": 1,
                         "eval_interval_steps": eval_every, "eval_tokens": 2048 if eval_every else 0,
                         "checkpoint_interval_steps": 0},
            "optimizer": {"lr": "1e-2", "min_lr": 1.0e-3, "warmup_steps": 5},
            "resources": {"gpu_type": gpu_type, "gpu_count": 1},
            "max_attempts": 1}


EXPERIMENT = """\
display_name: py-recipe
base:
  model: {{num_layers: 1, d_model: 16, num_heads: 2}}
  data: {{train_path: {train}, seq_len: 64, packing: packed}}
  training: {{max_steps: 60, micro_batch_rows: 2, eval_interval_steps: 15,
             eval_tokens: 2048, checkpoint_interval_steps: 0, seed: 1}}
  optimizer: {{lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 5}}
  resources: {{gpu_type: cpu, gpu_count: 1}}
  max_attempts: 1
variants:
  - name: naive
    overrides: {{data: {{packing: pad_to_seq_len}}}}
  - name: packed
    overrides: {{}}
target: {{from_variant: naive}}
"""

PKI = None
CLUSTER = None


class Cluster:
    """One TLS tallyd with tokens for tenants research (alice) and dev
    (bob), prices, and two CPU workers with client certificates."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tally_py_")
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            # Room for the paging test's 1,010 submits in a few seconds.
            f.write("usd_per_gpu_hour: {cpu: %g}\n"
                    "limits: {submits_per_second: 2000, submit_burst: 2000}\n" % PRICE)
        self.tallyd = Tallyd(self.dir, secure_args(PKI) + ["--config=" + config],
                             ca_cert=PKI.ca, token=PKI.tokens["ops"])
        self.workers = []
        for wid, (cert, key) in (("w1", (PKI.w1_cert, PKI.w1_key)),
                                 ("w2", (PKI.w2_cert, PKI.w2_key))):
            self.workers.append(Worker(self.tallyd.grpc_addr, wid, self.dir, [
                "--ca_cert=" + PKI.ca, "--tls_cert=" + cert, "--tls_key=" + key]))

    def client(self, who="alice", **kwargs):
        return tally.Client(self.tallyd.grpc_addr, ca_cert=PKI.ca, token=PKI.tokens[who],
                            environ={}, **kwargs)

    def env(self, who="alice"):
        """The environment a user's shell would have."""
        return {"PATH": os.environ.get("PATH", ""), "HOME": self.dir,
                "TALLY_CONTROLLER": self.tallyd.grpc_addr, "TALLY_CA_CERT": PKI.ca,
                "TALLY_TOKEN": PKI.tokens[who]}

    def close(self):
        for w in self.workers:
            w.kill()
        self.tallyd.stop()


def setUpModule():
    global PKI, CLUSTER
    PKI = Pki()
    CLUSTER = Cluster()


def tearDownModule():
    CLUSTER.close()
    shutil.rmtree(PKI.dir, ignore_errors=True)


class Base(unittest.TestCase):
    def tearDown(self):
        outcome = getattr(self, "_outcome", None)
        if outcome is not None and not getattr(outcome, "success", True):
            print("--- tallyd log (tail) ---\n" + CLUSTER.tallyd.logs()[-6000:], file=sys.stderr)


class DescriptorTest(unittest.TestCase):
    """The installed package's messages are proto/'s, as a fresh protoc run
    compiles them today."""

    def test_installed_descriptors_match_proto(self):
        from google.protobuf import descriptor_pb2
        import importlib
        out = os.path.join(tempfile.mkdtemp(prefix="tally_desc_"), "set.pb")
        subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                        "--descriptor_set_out=" + out] + PROTOS, check=True)
        fresh = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fresh.ParseFromString(f.read())
        self.assertEqual(sorted(f.name for f in fresh.file), sorted(PROTOS))
        for want in fresh.file:
            module = importlib.import_module(
                "tally.v1." + os.path.basename(want.name)[:-len(".proto")] + "_pb2")
            have = descriptor_pb2.FileDescriptorProto()
            have.ParseFromString(module.DESCRIPTOR.serialized_pb)
            for fdp in (want, have):  # json_name is derived; protoc versions differ in filling it
                for m in fdp.message_type:
                    _clear_json_names(m)
            self.assertEqual(have.SerializeToString(deterministic=True),
                             want.SerializeToString(deterministic=True),
                             "%s: the installed tally package was built from another proto/; "
                             "reinstall it (pip install ./python)" % want.name)


def _clear_json_names(m):
    for f in m.field:
        f.ClearField("json_name")
    for n in m.nested_type:
        _clear_json_names(n)


class ConnectionTest(Base):
    """tallyctl and tally.Client read one config and reach the same tallyd
    with the same credentials."""

    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="tally_home_")
        folder = os.path.join(self.home, ".config", "tally")
        os.makedirs(folder)
        for who in ("alice", "bob"):
            with open(os.path.join(folder, who + ".token"), "w") as f:
                f.write(PKI.tokens[who] + "\n")
        # alice's context: a dead address first (failover), the server's
        # name checked as localhost; bob's: a relative token path.
        with open(os.path.join(folder, "config.yaml"), "w") as f:
            f.write("current_context: research\n"
                    "contexts:\n"
                    "  - name: research\n"
                    "    address: 127.0.0.1:1,%s\n"
                    "    ca_cert: %s\n"
                    "    token_file: ~/.config/tally/alice.token\n"
                    "    tls_server_name: localhost\n"
                    "  - name: dev\n"
                    "    address: %s\n"
                    "    ca_cert: %s\n"
                    "    token_file: bob.token\n"
                    % (CLUSTER.tallyd.grpc_addr, PKI.ca, CLUSTER.tallyd.grpc_addr, PKI.ca))
        CLUSTER.client("alice").submit(tiny(name="cfg-a", gpu_type="none-such"))
        CLUSTER.client("bob").submit(tiny(name="cfg-b", gpu_type="none-such"))

    def both(self, env):
        """(tallyctl's first page, the client's first page) of job names and
        tenants, or the failure of each."""
        env = dict(env, HOME=self.home, PATH=os.environ.get("PATH", ""))
        r = subprocess.run([TALLYCTL, "list", "--output=json", "--page_size=5"],
                           capture_output=True, text=True, env=env, timeout=60)
        ctl = ("exit %d" % r.returncode if r.returncode else
               [(j["name"], j.get("tenant", "")) for j in json.loads(r.stdout).get("jobs", [])])
        try:
            client = tally.Client(environ=env)
            jobs = client.list(page_size=5)
            py = [(j.name, j.tenant) for _, j in zip(range(5), jobs)]
            client.close()
        except tally.TallyError as e:  # as tallyctl's exit codes
            py = "exit %d" % (2 if isinstance(e, (tally.ConfigError, tally.InvalidSpec)) else
                              3 if isinstance(e, tally.NotFound) else
                              4 if isinstance(e, tally.FailedPrecondition) else
                              5 if isinstance(e, tally.Unavailable) else 1)
        return ctl, py

    def test_both_resolve_the_same_context_token_and_address(self):
        cases = {
            "current_context": {},
            "TALLY_CONTEXT": {"TALLY_CONTEXT": "dev"},
            "TALLY_TOKEN over the context": {"TALLY_TOKEN": PKI.tokens["bob"]},
            "TALLY_CONTROLLER over the context": {
                "TALLY_CONTEXT": "dev", "TALLY_CONTROLLER": "127.0.0.1:2," + CLUSTER.tallyd.grpc_addr},
            "unknown context": {"TALLY_CONTEXT": "nope"},
            "missing named config": {"TALLY_CONFIG": os.path.join(self.home, "none.yaml")},
            "another CA": {"TALLY_CA_CERT": PKI.other_ca},
            "a refused token": {"TALLY_TOKEN": "not-a-token"},
            "a JWT": {"TALLY_TOKEN": PKI.jwt("carol", "dev", "user")},
        }
        tenants = {}
        for what, env in cases.items():
            ctl, py = self.both(env)
            self.assertEqual(ctl, py, what)
            tenants[what] = {t for _, t in py} if isinstance(py, list) else py
        self.assertEqual(tenants["current_context"], {"research"})
        self.assertEqual(tenants["TALLY_CONTEXT"], {"dev"})
        self.assertEqual(tenants["TALLY_TOKEN over the context"], {"dev"})
        self.assertEqual(tenants["unknown context"], "exit 2")
        self.assertEqual(tenants["another CA"], "exit 5")
        self.assertEqual(tenants["a refused token"], "exit 1")
        self.assertEqual(tenants["a JWT"], {"dev"})
        conn = tally.Client.from_config(environ={"HOME": self.home}).connection
        self.assertEqual(conn.context, "research")
        self.assertEqual(conn.addresses, ("127.0.0.1:1", CLUSTER.tallyd.grpc_addr))
        self.assertEqual(conn.tls_server_name, "localhost")
        self.assertNotIn(PKI.tokens["alice"], repr(conn))
        dev = tally.Client.from_config("dev", environ={"HOME": self.home}).connection
        self.assertTrue(dev.token_source.endswith("/.config/tally/bob.token"), dev.token_source)

    def test_bad_settings_name_the_setting(self):
        with self.assertRaises(tally.ConfigError) as cm:
            tally.Client("127.0.0.1", environ={})
        self.assertIn("has no port", str(cm.exception))
        with self.assertRaises(tally.ConfigError) as cm:
            tally.Client(token="a b", environ={})
        self.assertIn("token:", str(cm.exception))
        self.assertNotIn("a b", str(cm.exception))


class JobsTest(Base):

    def test_submit_watch_to_done_with_checkpoints_history_and_estimate(self):
        c = CLUSTER.client("alice")
        self.addCleanup(c.close)
        spec = tiny(max_steps=30, name="py-done", eval_every=10)
        spec["training"]["checkpoint_interval_steps"] = 15
        spec["model"]["d_model"] = 32
        spec["training"]["eval_quantized"] = "q4_0"  # a quantized loss at every evaluation
        estimate = c.estimate(spec)
        self.assertGreater(estimate.cost_usd, 0)
        job = c.submit(spec, request_id="py-done-1")
        again = c.submit(spec, request_id="py-done-1")
        self.assertEqual(job.name, again.name)  # the same request id makes one job
        self.assertEqual(job.tenant, "research")
        events = list(c.watch(job))
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))
        self.assertIsInstance(events[0], pkg_jobs_pb2.JobEvent)
        self.assertEqual(events[-1].state, pkg_jobs_pb2.JOB_STATE_SUCCEEDED)
        done = c.get(job.name.split("/")[1])
        self.assertEqual(done.state, pkg_jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(done.last_event_sequence, events[-1].sequence)
        self.assertTrue(c.checkpoints(job))
        history = c.eval_history(job)
        df = history.to_dataframe()
        self.assertEqual(list(df.columns), ["step", "tokens", "cost_usd", "gpu_seconds",
                                            "val_loss", "quantized_val_loss"])
        self.assertGreaterEqual(len(df), 3)
        self.assertTrue((df["val_loss"] > 0).all())
        self.assertTrue((df["quantized_val_loss"] > 0).all(), df)
        self.assertTrue(done.HasField("quantized_val_loss"))
        # The train loss at every reported step, from the curve tallyd keeps
        # (more points than the thinned progress events).
        train = c.train_history(job).to_dataframe()
        self.assertEqual(list(train.columns), ["step", "tokens", "train_loss", "attempt"])
        progress_steps = {e.step for e in events if e.type == "progress"}
        self.assertGreaterEqual(len(train), len(progress_steps))
        self.assertEqual(train["step"].iloc[-1], done.step)
        self.assertTrue(train["step"].is_monotonic_increasing)
        self.assertTrue((train["train_loss"] > 0).all())
        self.assertNotIn(0, list(train["step"]))
        listed = next(j for j in c.list(name_prefix="py-done") if j.name == job.name)
        self.assertEqual(len(listed.train_curve), 0)  # ListJobs leaves the curve out
        with self.assertRaises(tally.FailedPrecondition):
            c.cancel(job)

    def test_validate_and_submit_refuse_a_bad_spec_naming_the_field(self):
        c = CLUSTER.client("alice")
        self.addCleanup(c.close)
        self.assertEqual(c.validate(tiny()).model.d_model, 16)
        bad = tiny()
        bad["model"]["num_heads"] = 3  # 16 is not a multiple of 3
        with self.assertRaises(tally.InvalidSpec) as cm:
            c.validate(bad)
        self.assertIn("num_heads", cm.exception.field)
        self.assertEqual(cm.exception.address, CLUSTER.tallyd.grpc_addr)
        with self.assertRaises(tally.InvalidSpec) as cm:
            c.submit(dict(tiny(), modle={}))
        self.assertEqual(cm.exception.field, "spec.modle")
        with self.assertRaises(tally.InvalidSpec) as cm:
            c.submit(dict(tiny(), data=dict(tiny()["data"], packing="tight")))
        self.assertEqual(cm.exception.field, "spec.data.packing")
        # A spec file, as tallyctl submit -f reads it.
        path = os.path.join(tempfile.mkdtemp(), "job.yaml")
        with open(path, "w") as f:
            f.write("model: {num_layers: 1, d_model: 16, num_heads: 2}\n"
                    "data: {train_path: %s, seq_len: 64}\n"
                    "training: {max_steps: 5, micro_batch_rows: 2}\n"
                    "optimizer: {lr: 3e-3}\n"
                    "resources: {gpu_type: none-such}\n" % TRAIN_PATH)
        job = c.submit(path)
        self.assertAlmostEqual(job.spec.optimizer.lr, 3e-3)
        c.cancel(job, reason="done")

    def test_a_refused_token_and_another_tenants_job(self):
        alice = CLUSTER.client("alice")
        bob = CLUSTER.client("bob")
        self.addCleanup(alice.close)
        self.addCleanup(bob.close)
        job = alice.submit(tiny(gpu_type="none-such", name="mine"))
        with self.assertRaises(tally.NotFound) as cm:
            bob.get(job)
        self.assertTrue(cm.exception.message)
        with self.assertRaises(tally.NotFound):
            bob.cancel(job)
        names = {j.name for j in bob.list(states=["queued"])}
        self.assertNotIn(job.name, names)
        stranger = tally.Client(CLUSTER.tallyd.grpc_addr, ca_cert=PKI.ca, token="not-a-token",
                                environ={})
        self.addCleanup(stranger.close)
        with self.assertRaises(tally.Unauthenticated) as cm:
            stranger.get(job)
        self.assertNotIn("not-a-token", str(cm.exception))
        viewer = CLUSTER.client("vera")
        self.addCleanup(viewer.close)
        self.assertEqual(viewer.get(job).name, job.name)
        with self.assertRaises(tally.PermissionDenied):
            viewer.submit(tiny())
        nobody = tally.Client("127.0.0.1:1", environ={}, retries=2, timeout=2)
        with self.assertRaises(tally.Unavailable):
            nobody.get(job)
        alice.cancel(job)

    def test_paging_over_a_thousand_jobs(self):
        # bob's tenant: jobs no worker can take (gpu_type none-such), left
        # queued, listed in pages of 97; then the asyncio client's pages.
        c = CLUSTER.client("bob")
        self.addCleanup(c.close)
        spec = tally.load_job_spec(tiny(gpu_type="none-such", name="page"))
        submitted = {c.submit(spec).name for _ in range(1010)}
        listed = [j.name for j in c.list(states=["queued"], page_size=97)]
        self.assertEqual(len(listed), len(set(listed)))  # no repeats across pages
        self.assertLessEqual(submitted, set(listed))
        ids = [int(n.split("/")[1]) for n in listed]
        self.assertEqual(ids, sorted(ids, reverse=True))  # newest first, no gaps between pages

        async def async_names():
            async with tally.aio.Client(CLUSTER.tallyd.grpc_addr, ca_cert=PKI.ca,
                                        token=PKI.tokens["bob"], environ={}) as a:
                return [j.name async for j in a.list(states=["queued"], page_size=500)]

        self.assertEqual(asyncio.run(async_names()), listed)

    def test_list_filters_by_label_name_prefix_and_creation_time_on_tallyd(self):
        import datetime
        c = CLUSTER.client("bob")
        self.addCleanup(c.close)
        made = {}
        for name, labels in (("flt-a1", {"sweep": "s1", "lr": "1"}),
                             ("flt-a2", {"sweep": "s1", "lr": "2"}),
                             ("flt-b1", {"sweep": "s2"})):
            spec = tiny(gpu_type="none-such", name=name)
            spec["labels"] = labels
            made[name] = c.submit(spec).name
        self.addCleanup(lambda: [c.cancel(n) for n in made.values()])

        def names(**filters):
            return [j.spec.display_name for j in c.list(page_size=1, **filters)]

        self.assertEqual(names(labels={"sweep": "s1"}), ["flt-a2", "flt-a1"])
        self.assertEqual(names(labels={"sweep": "s1", "lr": "1"}), ["flt-a1"])
        self.assertEqual(names(name_prefix="flt-b"), ["flt-b1"])
        self.assertEqual(names(name_prefix="flt-", labels={"sweep": "s2"}), ["flt-b1"])
        recent = names(name_prefix="flt-", created_after=datetime.timedelta(minutes=10))
        self.assertEqual(recent, ["flt-b1", "flt-a2", "flt-a1"])
        self.assertEqual(names(name_prefix="flt-", created_before=datetime.timedelta(hours=1)),
                         [])
        with self.assertRaises(tally.InvalidSpec) as cm:
            list(c.list(created_after=datetime.timedelta(0),
                        created_before=datetime.timedelta(hours=1)))
        self.assertEqual(cm.exception.field, "created_before")
        with self.assertRaises(tally.InvalidSpec) as cm:
            list(c.list(labels={"k": "v" * 300}))
        self.assertIn("at most 256", str(cm.exception))

        async def async_names():
            async with tally.aio.Client(CLUSTER.tallyd.grpc_addr, ca_cert=PKI.ca,
                                        token=PKI.tokens["bob"], environ={}) as a:
                return [j.spec.display_name async for j in a.list(labels={"sweep": "s1"})]

        self.assertEqual(asyncio.run(async_names()), ["flt-a2", "flt-a1"])
        # tallyctl list sends the same filters.
        r = subprocess.run([TALLYCTL, "list", "--label=sweep=s1", "--name_prefix=flt-",
                            "--created_after=10m", "--output=json"], capture_output=True,
                           text=True, env=CLUSTER.env("bob"), timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([j["spec"]["display_name"] for j in json.loads(r.stdout)["jobs"]],
                         ["flt-a2", "flt-a1"])
        r = subprocess.run([TALLYCTL, "list", "--label=sweep"], capture_output=True, text=True,
                           env=CLUSTER.env("bob"), timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--label: \"sweep\" is not KEY=VALUE", r.stderr)

    def test_watch_resumes_after_tallyd_is_killed_and_restarted(self):
        c = CLUSTER.client("alice")
        self.addCleanup(c.close)
        job = c.submit(tiny(max_steps=3000, name="py-resume", eval_every=500))
        events = []
        errors = []
        progressed = threading.Event()

        def follow():
            try:
                for e in c.watch(job):
                    events.append(e)
                    if e.type == "progress":
                        progressed.set()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                progressed.set()

        t = threading.Thread(target=follow)
        t.start()
        self.assertTrue(progressed.wait(120), "no progress event")
        self.assertEqual(c.get(job).state, pkg_jobs_pb2.JOB_STATE_RUNNING)
        CLUSTER.tallyd.restart()  # kill -9, then start on the same ports
        seen_at_restart = len(events)
        t.join(300)
        self.assertFalse(t.is_alive(), "the watch did not end")
        self.assertEqual(errors, [])
        self.assertGreater(len(events), seen_at_restart)  # events read after the restart
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))
        self.assertEqual(events[-1].state, pkg_jobs_pb2.JOB_STATE_SUCCEEDED)
        # The same events as a fresh watch reads now.
        fresh = [(e.sequence, e.type) for e in c.watch(job)]
        self.assertEqual([(e.sequence, e.type) for e in events], fresh)


class ExperimentTest(Base):

    def test_experiment_to_its_table_dataframe_plot_and_examples(self):
        c = CLUSTER.client("alice")
        self.addCleanup(c.close)
        path = os.path.join(CLUSTER.dir, "py-exp.yaml")
        with open(path, "w") as f:
            f.write(EXPERIMENT.format(train=TRAIN_PATH))
        exp = c.experiments.create(path)
        self.assertIsInstance(exp, pkg_experiments_pb2.Experiment)
        events = list(c.experiments.watch(exp))
        self.assertEqual([e.sequence for e in events], list(range(1, len(events) + 1)))
        report = c.experiments.report(exp)
        self.assertEqual(report.experiment.state, pkg_experiments_pb2.EXPERIMENT_STATE_SUCCEEDED)
        self.assertGreater(report.target_val_loss, 0)
        self.assertEqual([v.name for v in report.variants], ["naive", "packed"])
        text = report.table()
        self.assertIn("naive", text)
        self.assertIn("packed", text)
        df = report.to_dataframe()
        self.assertEqual(list(df.index), ["naive", "packed"])
        self.assertEqual(df.loc["naive", "state"], "SUCCEEDED")
        self.assertEqual(df.loc["packed", "cost_usd"], report.variants[1].cost_usd)
        self.assertTrue(all(report.curves[n] for n in ("naive", "packed")))
        self.assertIn(exp.name, [e.name for e in c.experiments.list()])

        png = os.path.join(CLUSTER.dir, "loss.png")
        fig = tally.plot_loss_vs_dollars(report)
        fig.savefig(png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        ax = fig.axes[0]
        self.assertEqual([t.get_text().split("\n")[0] for t in ax.get_legend().get_texts()],
                         ["naive", "packed"])
        self.assertTrue(ax.get_xlabel().startswith(("recipe dollars", "dollars billed")))

        async def async_report():
            async with tally.aio.Client(CLUSTER.tallyd.grpc_addr, ca_cert=PKI.ca,
                                        token=PKI.tokens["alice"], environ={}) as a:
                r = await a.experiments.report(exp.name)
                ev = [e.sequence async for e in a.experiments.watch(exp)]
                return r, ev

        r, ev = asyncio.run(async_report())
        self.assertEqual(r.rows(), report.rows())
        self.assertEqual(ev, [e.sequence for e in events])

        # examples/python: the script runs an experiment file and prints the
        # table; the notebook plots this experiment.
        env = dict(CLUSTER.env("alice"), PYTHONPATH="")
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "recipe_experiment.py"), path],
                           capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("naive", r.stdout)
        self.assertIn("experiments/", r.stdout)

        import nbformat
        from nbclient import NotebookClient
        nb = nbformat.read(os.path.join(EXAMPLES, "loss_vs_dollars.ipynb"), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                self.assertEqual(cell.get("outputs", []), [], "store the notebook without outputs")
                self.assertIsNone(cell.get("execution_count"))
        old = dict(os.environ)
        os.environ.update(CLUSTER.env("alice"))
        os.environ.update(TALLY_EXPERIMENT=exp.name)
        os.environ.pop("MPLBACKEND", None)  # a fresh kernel's own backend, as a user has
        try:
            NotebookClient(nb, timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": EXAMPLES}}).execute()
        finally:
            os.environ.clear()
            os.environ.update(old)
        # The plot cell, whose last expression is the Figure, shows it as an
        # image (not "<Figure size ...>"), once.
        plot_cell = next(c for c in nb.cells if "plot_loss_vs_dollars(report)" in c.source)
        images = [o["data"]["image/png"] for o in plot_cell.outputs if "image/png" in o.get("data", {})]
        self.assertEqual(len(images), 1, plot_cell.outputs)
        self.assertEqual(base64.b64decode(images[0])[:8], b"\x89PNG\r\n\x1a\n")
        self.assertNotIn("<Figure size", json.dumps(plot_cell.outputs))
        # A job as a cell's last expression: one line of text and a table.
        job_cell = next(c for c in nb.cells if "client.get(" in c.source)
        data = job_cell.outputs[0]["data"]
        self.assertTrue(data["text/plain"].startswith("<tally Job jobs/"), data)
        self.assertLess(len(data["text/plain"]), 200)
        self.assertIn("SUCCEEDED", data["text/html"])


if __name__ == "__main__":
    unittest.main()
