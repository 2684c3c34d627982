"""tallyctl's connection settings: a config file's contexts choosing tallyd's
address against a real (plaintext) tallyd, `token create` and `token hash`,
and, against a small TLS gRPC server in this process standing in for a
secured tallyd, TLS verification, the bearer token on every call, the hints
for refused calls and the new ownership fields in get and watch."""

import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import tempfile
import unittest

from harness import (TALLYCTL, ClusterTest, experiments_pb2, experiments_pb2_grpc, grpc,
                     jobs_pb2, jobs_pb2_grpc)

# Variables of the calling shell that would change what tallyctl connects to.
_OURS = ("TALLY_CONTROLLER", "TALLY_TOKEN", "TALLY_CA_CERT", "TALLY_CONTEXT", "TALLY_CONFIG")


def run_tallyctl(home, *args, env=None, stdin=None):
    """tallyctl with HOME at `home` and none of the caller's TALLY_* settings."""
    full = {k: v for k, v in os.environ.items() if k not in _OURS}
    full["HOME"] = home
    full.update(env or {})
    return subprocess.run([TALLYCTL] + list(args), capture_output=True, text=True,
                          env=full, input=stdin, timeout=60)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


class ConfigAgainstTallydTest(ClusterTest):

    def setUp(self):
        super().setUp()
        self.home = tempfile.mkdtemp(prefix="tally_home_")
        self.config = os.path.join(self.home, ".config", "tally", "config.yaml")

    def test_the_current_context_or_context_flag_chooses_the_address(self):
        self.submit()
        write(self.config,
              "current_context: real\n"
              "contexts:\n"
              "  - name: real\n"
              "    address: %s\n"
              "  - name: nowhere\n"
              "    address: 127.0.0.1:1\n" % self.tallyd.grpc_addr)
        r = run_tallyctl(self.home, "list", "--output=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(json.loads(r.stdout)["jobs"]), 1)
        # --context, then TALLY_CONTEXT, beat current_context.
        r = run_tallyctl(self.home, "list", "--context", "nowhere", "--timeout=2s")
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("127.0.0.1:1", r.stderr)
        r = run_tallyctl(self.home, "list", env={"TALLY_CONTEXT": "nowhere"}, )
        self.assertEqual(r.returncode, 5, r.stderr)
        # The flag and the variable beat the context's address.
        r = run_tallyctl(self.home, "list", "--context=nowhere",
                         "--controller=" + self.tallyd.grpc_addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_tallyctl(self.home, "list", "--context=nowhere",
                         env={"TALLY_CONTROLLER": self.tallyd.grpc_addr})
        self.assertEqual(r.returncode, 0, r.stderr)
        # An unknown context lists the known ones.
        r = run_tallyctl(self.home, "list", "--context=staging")
        self.assertEqual(r.returncode, 2)
        self.assertIn('--context "staging" names no context', r.stderr)
        self.assertIn("known: real, nowhere", r.stderr)

    def test_a_named_config_file_is_used_and_a_bad_one_exits_2_naming_the_field(self):
        other = write(os.path.join(self.home, "other.yaml"),
                      "current_context: x\ncontexts: [{name: x, address: '%s'}]\n"
                      % self.tallyd.grpc_addr)
        for args, env in ((["--config_file=" + other], {}), ([], {"TALLY_CONFIG": other})):
            r = run_tallyctl(self.home, "list", *args, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
        bad = write(os.path.join(self.home, "bad.yaml"),
                    "current_context: x\n"
                    "contexts:\n"
                    "  - name: x\n"
                    "    adress: 127.0.0.1:1\n")
        r = run_tallyctl(self.home, "list", "--config_file=" + bad)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(bad, r.stderr)
        self.assertIn("contexts[0].adress (line 4): unknown field", r.stderr)
        self.assertIn("address", r.stderr)
        write(bad, "contexts:\n  - {name: x, address: 'a:1'}\n  - {name: x, address: 'b:1'}\n")
        r = run_tallyctl(self.home, "list", "--config_file=" + bad)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("contexts[1].name (line 3)", r.stderr)
        self.assertIn("unique", r.stderr)
        # A named file that is missing is an error; the default one is not.
        r = run_tallyctl(self.home, "list", "--config_file=" + self.home + "/none.yaml")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--config_file " + self.home + "/none.yaml", r.stderr)
        r = run_tallyctl(self.home, "list", env={"TALLY_CONTROLLER": self.tallyd.grpc_addr})
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_an_unreadable_token_file_or_ca_cert_exits_2_naming_it(self):
        write(self.config,
              "current_context: x\ncontexts:\n"
              "  - {name: x, address: '%s', token_file: ~/missing.token}\n"
              % self.tallyd.grpc_addr)
        r = run_tallyctl(self.home, "list")
        self.assertEqual(r.returncode, 2)
        self.assertIn("token_file " + self.home + "/missing.token", r.stderr)
        notpem = write(os.path.join(self.home, "ca.txt"), "not a certificate\n")
        r = run_tallyctl(self.home, "list", "--token=t", "--ca_cert=" + notpem)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--ca_cert " + notpem, r.stderr)

    def test_a_token_on_a_plaintext_loopback_channel_is_accepted(self):
        # tallyd without authentication ignores the header; the call works.
        token = write(os.path.join(self.home, "t"), "  some-token\n")
        r = run_tallyctl(self.home, "list", "--token_file=" + token,
                         env={"TALLY_CONTROLLER": self.tallyd.grpc_addr})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("warning", r.stderr)


class TokenCommandsTest(unittest.TestCase):

    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="tally_home_")

    def test_token_create_prints_a_token_and_its_entry(self):
        r = run_tallyctl(self.home, "token", "create", "--name", "alice", "--tenant",
                         "research", "--role", "user")
        self.assertEqual(r.returncode, 0, r.stderr)
        token, entry = r.stdout.splitlines()
        self.assertRegex(token, r"^[0-9a-f]{64}$")
        m = re.fullmatch(r'  - \{name: alice, tenant: research, role: user, '
                         r'token_sha256: "([0-9a-f]{64})"\}', entry)
        self.assertIsNotNone(m, entry)
        self.assertEqual(m.group(1), hashlib.sha256(token.encode()).hexdigest())
        h = run_tallyctl(self.home, "token", "hash", stdin=token + "\n")
        self.assertEqual(h.returncode, 0, h.stderr)
        self.assertEqual(h.stdout.strip(), m.group(1))
        again = run_tallyctl(self.home, "token", "create", "--name=alice", "--tenant=research",
                             "--role=user")
        self.assertNotEqual(again.stdout.splitlines()[0], token)

    def test_token_create_as_json(self):
        r = run_tallyctl(self.home, "token", "create", "--name=ops", "--role=admin",
                         "--output=json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(out["entry"], {"name": "ops", "tenant": "", "role": "admin",
                                        "token_sha256": hashlib.sha256(
                                            out["token"].encode()).hexdigest()})

    def test_token_create_checks_the_role_and_the_tenant(self):
        r = run_tallyctl(self.home, "token", "create", "--name=a", "--tenant=t", "--role=root")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--role", r.stderr)
        self.assertIn("admin, user, viewer or worker", r.stderr)
        r = run_tallyctl(self.home, "token", "create", "--name=a", "--role=viewer")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tenant: is required for the viewer role", r.stderr)
        self.assertEqual(r.stdout, "")


def _openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True)


def make_certs(folder):
    """A CA, a server certificate it signs for the name tally.test only, and a
    second CA that signed nothing."""
    p = lambda name: os.path.join(folder, name)  # noqa: E731
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", p(ca + ".key"), "-out", p(ca + ".pem"), "-days", "2",
                 "-subj", "/CN=" + ca)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", p("server.key"), "-out", p("server.csr"), "-subj", "/CN=tally.test")
    write(p("ext.cnf"), "subjectAltName=DNS:tally.test\n")
    _openssl("x509", "-req", "-in", p("server.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
             "-CAcreateserial", "-out", p("server.pem"), "-days", "2", "-extfile", p("ext.cnf"))
    return p


class FakeJobs(jobs_pb2_grpc.JobsServicer):
    """Answers as a tallyd with authentication would: the token "good" may
    read, "viewer-token-1" may not list, anything else is refused. Records the
    authorization header of every call."""

    def __init__(self):
        self.seen = []

    def _check(self, context, method):
        md = dict(context.invocation_metadata())
        header = md.get("authorization")
        self.seen.append((method, header))
        if header not in ("Bearer good", "Bearer viewer-token-1"):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid bearer token")
        if header == "Bearer viewer-token-1" and method == "ListJobs":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "viewer may not list other tenants")

    def GetJob(self, request, context):
        self._check(context, "GetJob")
        j = jobs_pb2.Job(name=request.name, state=jobs_pb2.JOB_STATE_CANCELLED,
                         tenant="research", submitted_by="alice", cancelled_by="bob")
        j.spec.training.max_steps = 10
        return j

    def ListJobs(self, request, context):
        self._check(context, "ListJobs")
        self.last_list = request
        return jobs_pb2.ListJobsResponse(jobs=[jobs_pb2.Job(name="jobs/1")])

    def WatchJob(self, request, context):
        self._check(context, "WatchJob")
        yield jobs_pb2.JobEvent(sequence=1, type="submitted", state=jobs_pb2.JOB_STATE_QUEUED,
                                principal="alice", patience_left=-1)
        yield jobs_pb2.JobEvent(sequence=2, type="cancelled",
                                state=jobs_pb2.JOB_STATE_CANCELLED, principal="bob",
                                reason="not needed", patience_left=-1)


class FakeExperiments(experiments_pb2_grpc.ExperimentsServicer):
    """An ended experiment with its owners, for any token."""

    def _experiment(self, name):
        return experiments_pb2.Experiment(
            name=name, state=experiments_pb2.EXPERIMENT_STATE_CANCELLED, tenant="research",
            created_by="alice", cancelled_by="bob")

    def GetExperiment(self, request, context):
        return self._experiment(request.name)

    def ListExperiments(self, request, context):
        self.last_list = request
        return experiments_pb2.ListExperimentsResponse(
            experiments=[self._experiment("experiments/1")])

    def WatchExperiment(self, request, context):
        yield experiments_pb2.ExperimentEvent(
            sequence=1, type="cancelled", state=experiments_pb2.EXPERIMENT_STATE_CANCELLED,
            principal="bob")


class TlsAndTokenTest(unittest.TestCase):
    """tallyctl against a TLS gRPC server that checks bearer tokens."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tally_tls_")
        cls.p = staticmethod(make_certs(cls.dir))
        with open(cls.p("server.key"), "rb") as k, open(cls.p("server.pem"), "rb") as c:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        cls.servicer = FakeJobs()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        jobs_pb2_grpc.add_JobsServicer_to_server(cls.servicer, cls.server)
        cls.experiments = FakeExperiments()
        experiments_pb2_grpc.add_ExperimentsServicer_to_server(cls.experiments, cls.server)
        cls.port = cls.server.add_secure_port("127.0.0.1:0", creds)
        cls.server.start()
        cls.addr = "127.0.0.1:%d" % cls.port

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)

    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="tally_home_")
        self.servicer.seen.clear()

    def ctl(self, *args, env=None, stdin=None):
        return run_tallyctl(self.home, *args, "--timeout=5s", env=env, stdin=stdin)

    def test_a_context_with_ca_cert_token_file_and_server_name_works(self):
        write(os.path.join(self.home, ".config", "tally", "prod.token"), "good\n")
        write(os.path.join(self.home, ".config", "tally", "config.yaml"),
              "current_context: prod\n"
              "contexts:\n"
              "  - name: prod\n"
              "    address: %s\n"
              "    ca_cert: %s\n"
              "    token_file: ~/.config/tally/prod.token\n"
              "    tls_server_name: tally.test\n" % (self.addr, self.p("ca.pem")))
        r = self.ctl("list", "--tenant=research")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("jobs/1", r.stdout)
        self.assertEqual(self.servicer.last_list.tenant, "research")
        self.assertEqual(self.servicer.seen, [("ListJobs", "Bearer good")])

    def test_the_token_is_sent_on_unary_calls_and_streams_and_never_printed(self):
        common = ["--controller=" + self.addr, "--ca_cert=" + self.p("ca.pem"),
                  "--tls_server_name=tally.test"]
        g = self.ctl("get", "7", *common, env={"TALLY_TOKEN": "good"})
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertIn("  tenant:    research   submitted by: alice   cancelled by: bob",
                      g.stdout)
        w = self.ctl("watch", "7", *common, "--token=good")
        self.assertEqual(w.returncode, 6, w.stderr)  # CANCELLED
        lines = w.stdout.splitlines()
        self.assertRegex(lines[0], r"submitted .* by alice$")
        self.assertRegex(lines[1], r"cancelled .* by bob not needed$")
        self.assertEqual([h for _, h in self.servicer.seen],
                         ["Bearer good"] * len(self.servicer.seen))
        self.assertEqual({m for m, _ in self.servicer.seen}, {"GetJob", "WatchJob"})
        j = self.ctl("get", "7", "--output=json", *common, "--token=good")
        self.assertEqual(j.returncode, 0, j.stderr)
        self.assertEqual(json.loads(j.stdout)["submitted_by"], "alice")
        for out in (g, w, j):
            self.assertNotIn("good", out.stdout + out.stderr)

    def test_experiments_show_their_owners_and_list_takes_a_tenant(self):
        common = ["--controller=" + self.addr, "--ca_cert=" + self.p("ca.pem"),
                  "--tls_server_name=tally.test"]
        g = self.ctl("experiment", "get", "1", *common)
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertIn("  tenant:    research   created by: alice   cancelled by: bob\n",
                      g.stdout)
        w = self.ctl("experiment", "watch", "1", *common)
        self.assertEqual(w.returncode, 6, w.stderr)  # CANCELLED
        self.assertRegex(w.stdout.splitlines()[0], r"^#1 .*cancelled .* by bob$")
        lst = self.ctl("experiment", "list", "--tenant=research", *common)
        self.assertEqual(lst.returncode, 0, lst.stderr)
        self.assertEqual(self.experiments.last_list.tenant, "research")

    def test_refused_calls_print_the_message_and_a_hint(self):
        common = ["--controller=" + self.addr, "--ca_cert=" + self.p("ca.pem"),
                  "--tls_server_name=tally.test"]
        r = self.ctl("list", *common)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no valid bearer token", r.stderr)
        self.assertIn("pass --token, set TALLY_TOKEN, or choose a --context with a token_file",
                      r.stderr)
        r = self.ctl("list", *common, "--token=wrong-token")
        self.assertEqual(r.returncode, 1)
        self.assertIn("the token from --token was refused", r.stderr)
        self.assertNotIn("wrong-token", r.stderr)
        r = self.ctl("list", *common, "--token=viewer-token-1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("viewer may not list other tenants", r.stderr)
        self.assertIn("role or tenant", r.stderr)

    def test_tls_verification_failures_exit_5_with_a_hint(self):
        # The certificate names tally.test, not 127.0.0.1.
        r = self.ctl("list", "--controller=" + self.addr, "--ca_cert=" + self.p("ca.pem"),
                     "--token=good")
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("check --ca_cert / TALLY_CA_CERT and the server's name", r.stderr)
        # Signed by another CA.
        r = self.ctl("list", "--controller=" + self.addr, "--tls_server_name=tally.test",
                     env={"TALLY_CA_CERT": self.p("other_ca.pem"), "TALLY_TOKEN": "good"})
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("check --ca_cert / TALLY_CA_CERT", r.stderr)
        self.assertIn("TALLY_CA_CERT " + self.p("other_ca.pem"), r.stderr)
        self.assertNotIn("E1", r.stderr.split("tallyctl:")[0], "no gRPC log lines")
        self.assertEqual(self.servicer.seen, [], "no call got through")
        # Plaintext to a TLS server.
        r = self.ctl("list", "--controller=" + self.addr, "--token=good")
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("if tallyd uses TLS, set --ca_cert", r.stderr)


if __name__ == "__main__":
    unittest.main()
