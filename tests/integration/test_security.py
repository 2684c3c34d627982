"""Security end to end: a real tallyd over TLS with user tokens, JWTs and
worker client certificates made by OpenSSL; every Jobs and Experiments
method against every kind of caller; fake workers without or with the wrong
credentials; a client that trusts another CA; the start-up refusals."""

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

from harness import (Tallyd, TALLYD, jobs_pb2, experiments_pb2, spec, wait_for, grpc,
                     ROOT, free_port, parse_exposition, TRAIN_PATH, metric_value)
from tally.v1 import workers_pb2, workers_pb2_grpc, jobs_pb2_grpc, experiments_pb2_grpc

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

CODE = grpc.StatusCode


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
            "-subj", "/CN=" + name, cwd=d)
    return os.path.join(d, name + ".pem")


def make_cert(d, ca, name, cn, san):
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn,
            "-addext", "subjectAltName=" + san, cwd=d)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-copy_extensions", "copy",
            cwd=d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sha256(token):
    return hashlib.sha256(token.encode()).hexdigest()


class Pki:
    """Certificates, tokens and a JWT signing key, made once per module."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tally_pki_")
        d = self.dir
        self.ca = make_ca(d, "ca")
        self.server_cert, self.server_key = make_cert(
            d, "ca", "server", "tallyd", "IP:127.0.0.1,DNS:localhost")
        self.w1_cert, self.w1_key = make_cert(d, "ca", "w1", "w1", "DNS:w1")
        self.w2_cert, self.w2_key = make_cert(d, "ca", "w2", "w2", "DNS:w2")
        self.other_ca = make_ca(d, "other")
        self.tokens = {name: "tok-" + name + "-" + os.urandom(8).hex()
                       for name in ("alice", "bob", "vera", "ops", "dadmin", "wt1", "wt2")}
        users = [("alice", "research", "user"), ("bob", "dev", "user"),
                 ("vera", "research", "viewer"), ("ops", "", "admin"),
                 ("dadmin", "dev", "admin")]
        self.auth_tokens = os.path.join(d, "users.yaml")
        with open(self.auth_tokens, "w") as f:
            f.write("principals:\n")
            for name, tenant, role in users:
                f.write('  - {name: %s, tenant: "%s", role: %s, token_sha256: "%s"}\n'
                        % (name, tenant, role, sha256(self.tokens[name])))
        self.worker_tokens = os.path.join(d, "workers.yaml")
        with open(self.worker_tokens, "w") as f:
            f.write('principals:\n  - {name: wt1, role: worker, token_sha256: "%s"}\n'
                    % sha256(self.tokens["wt1"]))
            f.write('  - {name: wt2, role: worker, token_sha256: "%s"}\n'
                    % sha256(self.tokens["wt2"]))
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = self.key.public_key().public_numbers()
        self.jwks = os.path.join(d, "jwks.json")
        with open(self.jwks, "w") as f:
            json.dump({"keys": [{"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig",
                                 "n": b64url(numbers.n.to_bytes(256, "big")),
                                 "e": b64url(numbers.e.to_bytes(3, "big"))}]}, f)

    def jwt(self, sub, tenant, role, exp_in=300, iss="https://issuer.test", aud="tally"):
        header = b64url(json.dumps({"alg": "RS256", "kid": "k1", "typ": "JWT"}).encode())
        now = int(time.time())
        claims = {"sub": sub, "tenant": tenant, "role": role, "iss": iss, "aud": aud,
                  "iat": now, "exp": now + exp_in}
        payload = b64url(json.dumps(claims).encode())
        signing_input = (header + "." + payload).encode()
        sig = self.key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return header + "." + payload + "." + b64url(sig)


PKI = None


def setUpModule():
    global PKI
    PKI = Pki()


def tearDownModule():
    shutil.rmtree(PKI.dir, ignore_errors=True)


def secure_args(pki, auth_tokens=None, worker_tokens=None):
    return ["--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
            "--client_ca=" + pki.ca, "--auth_tokens=" + (auth_tokens or pki.auth_tokens),
            "--worker_tokens=" + (worker_tokens or pki.worker_tokens), "--jwt_jwks=" + pki.jwks,
            "--jwt_issuer=https://issuer.test", "--jwt_audience=tally"]


def experiment_spec():
    e = experiments_pb2.ExperimentSpec(display_name="sec")
    e.base.CopyFrom(spec())
    e.variants.add(name="a")
    e.variants.add(name="b")
    e.target.val_loss = 1.0
    return e


class SecureCluster(unittest.TestCase):
    extra_args = ()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_sec_")
        # Each tallyd reads its own copy of the token files (SIGHUP tests).
        self.auth_tokens = os.path.join(self.dir, "users.yaml")
        shutil.copy(PKI.auth_tokens, self.auth_tokens)
        self.worker_tokens = os.path.join(self.dir, "workers.yaml")
        shutil.copy(PKI.worker_tokens, self.worker_tokens)
        self.tallyd = Tallyd(self.dir, secure_args(PKI, self.auth_tokens, self.worker_tokens)
                             + list(self.extra_args), ca_cert=PKI.ca, token=PKI.tokens["ops"])

    def tearDown(self):
        self.tallyd.stop()
        if hasattr(self, "_outcome") and not getattr(self._outcome, "success", True):
            print(self.tallyd.logs())

    def stubs(self, token=None, ca_cert=None):
        ch = self.tallyd.open_channel(token=token, ca_cert=ca_cert)
        self.addCleanup(ch.close)
        return jobs_pb2_grpc.JobsStub(ch), experiments_pb2_grpc.ExperimentsStub(ch)


class AccessMatrixTest(SecureCluster):
    """Every Jobs and Experiments method x every kind of caller: the exact
    status code."""

    def call(self, stubs, method, target):
        jobs, exps = stubs
        calls = {
            "SubmitJob": lambda: jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10),
            "GetJob": lambda: jobs.GetJob(jobs_pb2.GetJobRequest(name=target["job"]), timeout=10),
            "ListJobs": lambda: jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10),
            "CancelJob": lambda: jobs.CancelJob(
                jobs_pb2.CancelJobRequest(name=target["cancel_job"]), timeout=10),
            "WatchJob": lambda: next(iter(jobs.WatchJob(
                jobs_pb2.WatchJobRequest(name=target["job"]), timeout=10))),
            "ListCheckpoints": lambda: jobs.ListCheckpoints(
                jobs_pb2.ListCheckpointsRequest(name=target["job"]), timeout=10),
            "EstimateCost": lambda: jobs.EstimateCost(
                jobs_pb2.EstimateCostRequest(spec=spec()), timeout=10),
            "GetJobLogs": lambda: jobs.GetJobLogs(
                jobs_pb2.GetJobLogsRequest(name=target["job"]), timeout=10),
            "CreateExperiment": lambda: exps.CreateExperiment(
                experiments_pb2.CreateExperimentRequest(spec=experiment_spec()), timeout=10),
            "GetExperiment": lambda: exps.GetExperiment(
                experiments_pb2.GetExperimentRequest(name=target["exp"]), timeout=10),
            "ListExperiments": lambda: exps.ListExperiments(
                experiments_pb2.ListExperimentsRequest(), timeout=10),
            "CancelExperiment": lambda: exps.CancelExperiment(
                experiments_pb2.CancelExperimentRequest(name=target["cancel_exp"]), timeout=10),
            "WatchExperiment": lambda: next(iter(exps.WatchExperiment(
                experiments_pb2.WatchExperimentRequest(name=target["exp"]), timeout=10))),
        }
        try:
            calls[method]()
            return CODE.OK
        except grpc.RpcError as e:
            return e.code()

    def test_every_method_for_every_caller(self):
        alice = self.stubs(PKI.tokens["alice"])
        # alice's (tenant research) job and experiment; fresh ones to cancel
        # for each caller that may.
        job = alice[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        exp = alice[1].CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=experiment_spec()), timeout=10)
        self.assertEqual(job.tenant, "research")
        self.assertEqual(job.submitted_by, "alice")
        self.assertEqual(exp.tenant, "research")
        self.assertEqual(exp.created_by, "alice")

        callers = {
            "none": None,
            "bad token": "not-a-token",
            "expired JWT": PKI.jwt("carol", "research", "user", exp_in=-600),
            "other tenant": PKI.tokens["bob"],
            "viewer": PKI.tokens["vera"],
            "user": PKI.tokens["alice"],
            "JWT user": PKI.jwt("carol", "research", "user"),
            "admin": PKI.tokens["ops"],
            # An admin of another tenant acts only within its own.
            "tenant admin": PKI.tokens["dadmin"],
        }
        reads = ["GetJob", "ListJobs", "WatchJob", "ListCheckpoints", "EstimateCost",
                 "GetExperiment", "ListExperiments", "WatchExperiment", "GetJobLogs"]
        writes = ["SubmitJob", "CancelJob", "CreateExperiment", "CancelExperiment"]
        own = {"GetJob", "WatchJob", "ListCheckpoints", "CancelJob", "GetExperiment",
               "WatchExperiment", "CancelExperiment", "GetJobLogs"}
        expected = {}
        for caller in callers:
            for m in reads + writes:
                if caller in ("none", "bad token", "expired JWT"):
                    code = CODE.UNAUTHENTICATED
                elif caller in ("other tenant", "tenant admin"):
                    code = CODE.NOT_FOUND if m in own else CODE.OK
                elif caller == "viewer":
                    code = CODE.PERMISSION_DENIED if m in writes else CODE.OK
                else:
                    code = CODE.OK
                expected[(caller, m)] = code
        got = {}
        for caller, token in callers.items():
            stubs = self.stubs(token)
            target = {"job": job.name, "exp": exp.name}
            if expected[(caller, "CancelJob")] == CODE.OK:
                target["cancel_job"] = alice[0].SubmitJob(
                    jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10).name
                target["cancel_exp"] = alice[1].CreateExperiment(
                    experiments_pb2.CreateExperimentRequest(spec=experiment_spec()),
                    timeout=10).name
            else:
                target["cancel_job"], target["cancel_exp"] = job.name, exp.name
            for m in reads + writes:
                got[(caller, m)] = self.call(stubs, m, target)
        wrong = {k: (got[k].name, v.name) for k, v in expected.items() if got[k] != v}
        self.assertEqual(wrong, {}, "(caller, method): (got, expected)")
        # Nothing the refused callers tried moved alice's job or experiment.
        self.assertEqual(alice[0].GetJob(jobs_pb2.GetJobRequest(name=job.name), timeout=10).state,
                         jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(alice[1].GetExperiment(
            experiments_pb2.GetExperimentRequest(name=exp.name), timeout=10).state,
            experiments_pb2.EXPERIMENT_STATE_RUNNING)

    def test_tenants_list_only_their_own_and_admins_filter(self):
        alice, bob, ops = (self.stubs(PKI.tokens[n]) for n in ("alice", "bob", "ops"))
        a = alice[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(), request_id="same"),
                               timeout=10)
        b = bob[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(), request_id="same"),
                             timeout=10)
        # Request ids are per tenant: bob's "same" is his own job.
        self.assertNotEqual(a.name, b.name)
        names = lambda stubs, **kw: [j.name for j in stubs[0].ListJobs(
            jobs_pb2.ListJobsRequest(**kw), timeout=10).jobs]
        self.assertEqual(names(alice), [a.name])
        self.assertEqual(names(bob), [b.name])
        self.assertEqual(sorted(names(ops)), sorted([a.name, b.name]))
        self.assertEqual(names(ops, tenant="dev"), [b.name])
        with self.assertRaises(grpc.RpcError) as err:
            names(alice, tenant="dev")
        self.assertEqual(err.exception.code(), CODE.PERMISSION_DENIED)
        # Cancelling records who did it, on the job and its event.
        ops[0].CancelJob(jobs_pb2.CancelJobRequest(name=b.name, reason="cleanup"), timeout=10)
        ended = bob[0].GetJob(jobs_pb2.GetJobRequest(name=b.name), timeout=10)
        self.assertEqual(ended.cancelled_by, "ops")
        events = list(bob[0].WatchJob(jobs_pb2.WatchJobRequest(name=b.name), timeout=10))
        self.assertEqual(events[0].principal, "bob")
        self.assertEqual(events[-1].principal, "ops")

    def test_a_cancel_reason_is_bounded_printable_text(self):
        jobs, _ = self.stubs(PKI.tokens["alice"])
        job = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        for reason in ("\x1b[2J wiped", "x" * 1001):
            with self.assertRaises(grpc.RpcError) as err:
                jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name, reason=reason),
                               timeout=10)
            self.assertEqual(err.exception.code(), CODE.INVALID_ARGUMENT)
            self.assertIn("reason:", err.exception.details())
        self.assertEqual(jobs.GetJob(jobs_pb2.GetJobRequest(name=job.name), timeout=10).state,
                         jobs_pb2.JOB_STATE_QUEUED)

    def test_a_client_that_trusts_another_ca_fails_the_handshake(self):
        jobs, _ = self.stubs(PKI.tokens["alice"], ca_cert=PKI.other_ca)
        with self.assertRaises(grpc.RpcError) as err:
            jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5)
        self.assertEqual(err.exception.code(), CODE.UNAVAILABLE)

    def test_health_stays_open(self):
        # grpc.health.v1 without credentials: SERVING (no stubs needed:
        # the raw method with a serialized empty request).
        ch = self.tallyd.open_channel()
        self.addCleanup(ch.close)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")  # status: SERVING

    def test_sighup_reloads_the_token_file(self):
        new_token = "tok-new-" + os.urandom(8).hex()
        jobs, _ = self.stubs(new_token)
        with self.assertRaises(grpc.RpcError) as err:
            jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        self.assertEqual(err.exception.code(), CODE.UNAUTHENTICATED)
        with open(self.auth_tokens, "a") as f:
            f.write('  - {name: nina, tenant: research, role: user, token_sha256: "%s"}\n'
                    % sha256(new_token))
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: reloaded the token" in self.tallyd.logs(), what="the reload")
        jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        # A broken file fails closed: none of its tokens is accepted (the
        # admin's included), it is logged and counted, until it is fixed.
        with open(self.auth_tokens) as f:
            good = f.read()
        with open(self.auth_tokens, "w") as f:
            f.write(good + "  - {name: x, role: [\n")
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "every credential of --auth_tokens is refused" in self.tallyd.logs(),
                 what="the failed reload")
        for token in (new_token, PKI.tokens["ops"]):
            stub, _ = self.stubs(token)
            with self.assertRaises(grpc.RpcError) as err:
                stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
            self.assertEqual(err.exception.code(), CODE.UNAUTHENTICATED)
        self.assertEqual(metric_value(self.tallyd.scrape(),
                                "tally_credential_reload_failures_total", file="auth_tokens"), 1)
        # Workers' tokens come from their own file and are untouched; a JWT
        # still works.
        jwt_jobs, _ = self.stubs(PKI.jwt("carol", "research", "user"))
        jwt_jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        with open(self.auth_tokens, "w") as f:
            f.write(good)
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: self.tallyd.logs().count("SIGHUP: reloaded the token") >= 3,
                 what="the fixed reload")
        jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)


class FakeWorker:
    """A Workers.Connect stream sending a Hello, then heartbeats."""

    def __init__(self, channel, worker_id, metadata=()):
        self.received, self.error = [], None
        self.done = threading.Event()
        self._stop = threading.Event()
        stub = workers_pb2_grpc.WorkersStub(channel)

        def messages():
            yield workers_pb2.WorkerMessage(hello=workers_pb2.Hello(
                worker_id=worker_id, device="cpu", gpu_type="cpu", slots=1, version="test"))
            while not self._stop.wait(0.2):
                yield workers_pb2.WorkerMessage(heartbeat=workers_pb2.Heartbeat())

        def run():
            try:
                for m in stub.Connect(messages(), metadata=list(metadata), timeout=60):
                    self.received.append(m)
            except grpc.RpcError as e:
                self.error = e
            self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def close(self):
        self._stop.set()


class WorkerIdentityTest(SecureCluster):

    def worker_channel(self, cert=None, key=None):
        with open(PKI.ca, "rb") as f:
            root = f.read()
        def read(path):
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()
        chain, private = read(cert), read(key)
        ch = grpc.secure_channel(self.tallyd.grpc_addr, grpc.ssl_channel_credentials(
            root_certificates=root, private_key=private, certificate_chain=chain))
        self.addCleanup(ch.close)
        return ch

    def fake(self, channel, worker_id, metadata=()):
        w = FakeWorker(channel, worker_id, metadata)
        self.addCleanup(w.close)
        return w

    def test_workers_must_prove_their_id_and_nothing_moves_otherwise(self):
        job = self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        cases = {
            "no credentials": (self.worker_channel(), "w1", (), CODE.UNAUTHENTICATED),
            "another worker's certificate": (
                self.worker_channel(PKI.w2_cert, PKI.w2_key), "w1", (), CODE.PERMISSION_DENIED),
            "a user token": (self.worker_channel(), "w1",
                             (("authorization", "Bearer " + PKI.tokens["alice"]),),
                             CODE.PERMISSION_DENIED),
            "a worker token for another id": (
                self.worker_channel(), "w1",
                (("authorization", "Bearer " + PKI.tokens["wt1"]),), CODE.PERMISSION_DENIED),
        }
        for what, (ch, worker_id, md, code) in cases.items():
            w = self.fake(ch, worker_id, md)
            self.assertTrue(w.done.wait(10), what)
            self.assertIsNotNone(w.error, what)
            self.assertEqual(w.error.code(), code, (what, w.error.details()))
            self.assertEqual(w.received, [], what)
        time.sleep(0.5)
        self.assertEqual(self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=job.name),
                                                 timeout=10).state, jobs_pb2.JOB_STATE_QUEUED)
        # A user's credentials cannot be used the other way round either: a
        # worker token on the Jobs API.
        jobs, _ = self.stubs(PKI.tokens["wt1"])
        with self.assertRaises(grpc.RpcError) as err:
            jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        self.assertEqual(err.exception.code(), CODE.PERMISSION_DENIED)

    def test_the_right_certificate_or_token_gets_work_and_a_second_stream_is_refused(self):
        w1 = self.fake(self.worker_channel(PKI.w1_cert, PKI.w1_key), "w1")
        wait_for(lambda: w1.received, what="w1's Welcome")
        job = self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        wait_for(lambda: any(m.HasField("assignment") for m in w1.received),
                 what="the assignment")
        # A second stream for the live id, with the same certificate: refused,
        # and the live one keeps its attempt.
        again = self.fake(self.worker_channel(PKI.w1_cert, PKI.w1_key), "w1")
        self.assertTrue(again.done.wait(10))
        self.assertEqual(again.error.code(), CODE.ALREADY_EXISTS)
        self.assertFalse(w1.done.is_set())
        self.assertEqual(self.tallyd.jobs.GetJob(jobs_pb2.GetJobRequest(name=job.name),
                                                 timeout=10).worker_ids, ["w1"])
        # A worker token names its id.
        wt = self.fake(self.worker_channel(), "wt1",
                       (("authorization", "Bearer " + PKI.tokens["wt1"]),))
        wait_for(lambda: wt.received, what="wt1's Welcome")
        self.assertIsNone(wt.error)


class RevocationTest(SecureCluster):
    """A credential removed from its file ends the streams opened with it at
    the SIGHUP that removes it; a revoked worker gets no more work."""

    worker_channel = WorkerIdentityTest.worker_channel
    fake = WorkerIdentityTest.fake

    def remove_principal(self, path, name):
        with open(path) as f:
            lines = f.readlines()
        with open(path, "w") as f:
            f.writelines(l for l in lines if "name: %s," % name not in l)
        reloads = self.tallyd.logs().count("SIGHUP: reloaded the token")
        self.tallyd.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: self.tallyd.logs().count("SIGHUP: reloaded the token") > reloads,
                 what="the reload")

    def test_a_revoked_worker_gets_no_new_job_and_its_stream_ends(self):
        token = (("authorization", "Bearer " + PKI.tokens["wt1"]),)
        w1 = self.fake(self.worker_channel(), "wt1", token)
        wait_for(lambda: w1.received, what="wt1's Welcome")
        first = self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        wait_for(lambda: any(m.HasField("assignment") for m in w1.received),
                 what="wt1's first assignment")

        self.remove_principal(self.worker_tokens, "wt1")
        self.assertTrue(w1.done.wait(10), "the revoked worker's stream did not end")
        self.assertEqual(w1.error.code(), CODE.UNAUTHENTICATED, w1.error.details())
        self.assertIn("revoked", w1.error.details())
        received = len(w1.received)
        # Another tenant's job submitted after the revocation is not offered
        # to it (it has no slot anywhere: it waits).
        bob, _ = self.stubs(PKI.tokens["bob"])
        later = bob.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        time.sleep(1.0)
        self.assertEqual(len(w1.received), received)
        self.assertEqual(bob.GetJob(jobs_pb2.GetJobRequest(name=later.name), timeout=10).state,
                         jobs_pb2.JOB_STATE_QUEUED)
        # It cannot come back with the revoked token.
        again = self.fake(self.worker_channel(), "wt1", token)
        self.assertTrue(again.done.wait(10))
        self.assertEqual(again.error.code(), CODE.UNAUTHENTICATED)
        # A worker whose token stands gets the work (the jobs were placeable).
        w2 = self.fake(self.worker_channel(), "wt2",
                       (("authorization", "Bearer " + PKI.tokens["wt2"]),))
        wait_for(lambda: any(m.HasField("assignment") for m in w2.received),
                 what="wt2's assignment")
        self.assertIsNone(w2.error)
        self.assertNotIn(first.name, [m.assignment.job for m in w1.received[received:]
                                      if m.HasField("assignment")])

    def test_a_revoked_watchers_streams_end(self):
        jobs, exps = self.stubs(PKI.tokens["alice"])
        job = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        exp = exps.CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=experiment_spec()), timeout=10)
        ended = {}

        def watch(what, call):
            try:
                for _ in call:
                    pass
                ended[what] = CODE.OK
            except grpc.RpcError as e:
                ended[what] = (e.code(), e.details())

        calls = {"job": jobs.WatchJob(jobs_pb2.WatchJobRequest(name=job.name), timeout=60),
                 "experiment": exps.WatchExperiment(
                     experiments_pb2.WatchExperimentRequest(name=exp.name), timeout=60)}
        for what, call in calls.items():
            call.initial_metadata()  # established
            threading.Thread(target=watch, args=(what, call), daemon=True).start()
        time.sleep(0.5)
        self.assertEqual(ended, {}, "the watches ended before the revocation")
        self.remove_principal(self.auth_tokens, "alice")
        wait_for(lambda: len(ended) == 2, timeout=10, what="both watches to end")
        for what in calls:
            self.assertEqual(ended[what][0], CODE.UNAUTHENTICATED, (what, ended[what]))
            self.assertIn("revoked", ended[what][1])


class TenancyTest(SecureCluster):
    """Tenant admins, priority caps and preemption across tenants."""

    extra_args = ("--min_runtime_before_preemption=0s",)

    def test_a_tenant_admin_cannot_read_or_cancel_another_tenants_job(self):
        alice, dadmin, bob = (self.stubs(PKI.tokens[n]) for n in ("alice", "dadmin", "bob"))
        theirs = alice[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        own = bob[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec()), timeout=10)
        missing = "jobs/999999"

        def refusal(call, name):
            with self.assertRaises(grpc.RpcError) as err:
                call(name)
            return err.exception.code(), err.exception.details().replace(name, "NAME")

        for call in (lambda n: dadmin[0].GetJob(jobs_pb2.GetJobRequest(name=n), timeout=10),
                     lambda n: dadmin[0].CancelJob(jobs_pb2.CancelJobRequest(name=n),
                                                   timeout=10)):
            self.assertEqual(refusal(call, theirs.name), refusal(call, missing))
            self.assertEqual(refusal(call, theirs.name)[0], CODE.NOT_FOUND)
        self.assertEqual([j.name for j in dadmin[0].ListJobs(
            jobs_pb2.ListJobsRequest(), timeout=10).jobs], [own.name])
        with self.assertRaises(grpc.RpcError) as err:
            dadmin[0].ListJobs(jobs_pb2.ListJobsRequest(tenant="research"), timeout=10)
        self.assertEqual(err.exception.code(), CODE.PERMISSION_DENIED)
        # Within its tenant it is an admin: it cancels bob's job.
        dadmin[0].CancelJob(jobs_pb2.CancelJobRequest(name=own.name), timeout=10)
        self.assertEqual(alice[0].GetJob(jobs_pb2.GetJobRequest(name=theirs.name),
                                         timeout=10).state, jobs_pb2.JOB_STATE_QUEUED)

    def test_a_priority_above_the_cap_is_refused(self):
        alice, alice_exps = self.stubs(PKI.tokens["alice"])
        with self.assertRaises(grpc.RpcError) as err:
            alice.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(priority=1000)), timeout=10)
        self.assertEqual(err.exception.code(), CODE.INVALID_ARGUMENT)
        self.assertIn("spec.priority: 1000 is above the maximum of 100", err.exception.details())
        e = experiment_spec()
        e.base.priority = 101
        with self.assertRaises(grpc.RpcError) as err:
            alice_exps.CreateExperiment(experiments_pb2.CreateExperimentRequest(spec=e),
                                        timeout=10)
        self.assertEqual(err.exception.code(), CODE.INVALID_ARGUMENT)
        self.assertIn("spec.base.priority: 101", err.exception.details())
        alice.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(priority=100)), timeout=10)
        # A global admin is not capped.
        self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(priority=1000)),
                                   timeout=10)

    def test_no_preemption_across_tenants_by_default(self):
        w = FakeWorker(WorkerIdentityTest.worker_channel(self), "wt1",
                       (("authorization", "Bearer " + PKI.tokens["wt1"]),))
        self.addCleanup(w.close)
        bob, dadmin, alice = (self.stubs(PKI.tokens[n])[0] for n in ("bob", "dadmin", "alice"))
        low = bob.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(max_steps=100000)), timeout=10)
        wait_for(lambda: any(m.HasField("assignment") for m in w.received),
                 what="the low-priority job's assignment")
        high = alice.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(priority=100)), timeout=10)
        time.sleep(1.0)
        self.assertFalse(any(m.HasField("stop") for m in w.received),
                         "another tenant's job was preempted")
        self.assertEqual(alice.GetJob(jobs_pb2.GetJobRequest(name=high.name), timeout=10).state,
                         jobs_pb2.JOB_STATE_QUEUED)
        self.assertEqual(bob.GetJob(jobs_pb2.GetJobRequest(name=low.name),
                                    timeout=10).preemption.pending_for, "")
        # A higher-priority job of the same tenant does preempt it.
        mine = dadmin.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec(priority=50)), timeout=10)
        wait_for(lambda: any(m.HasField("stop") and m.stop.preempt for m in w.received),
                 what="the same-tenant preemption")
        self.assertEqual(bob.GetJob(jobs_pb2.GetJobRequest(name=low.name),
                                    timeout=10).preemption.pending_for, mine.name)


class StartupTest(unittest.TestCase):

    def start(self, *args):
        d = tempfile.mkdtemp(prefix="tally_sec_start_")
        self.addCleanup(shutil.rmtree, d, True)
        return subprocess.run([TALLYD, "--data_dir=" + d, "--metrics_listen=127.0.0.1:0"]
                              + list(args), capture_output=True, text=True, timeout=30)

    def test_refusals_name_the_flags(self):
        port = free_port()
        cases = [
            (["--listen=0.0.0.0:%d" % port], "--tls_cert"),
            (["--listen=0.0.0.0:%d" % port, "--tls_cert=" + PKI.server_cert,
              "--tls_key=" + PKI.server_key], "--auth_tokens"),
            (["--listen=0.0.0.0:%d" % port, "--tls_cert=" + PKI.server_cert,
              "--tls_key=" + PKI.server_key, "--auth_tokens=" + PKI.auth_tokens],
             "--client_ca"),
            (["--tls_cert=" + PKI.server_cert], "--tls_key"),
            (["--tls_cert=" + PKI.server_cert, "--tls_key=" + PKI.w1_key], "not the private key"),
            (["--client_ca=" + PKI.ca], "--tls_cert"),
            (["--auth_tokens=/nonexistent/users.yaml"], "--auth_tokens"),
            (["--jwt_jwks=" + PKI.jwks], "--jwt_issuer"),
        ]
        for args, needle in cases:
            r = self.start(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr[-500:]))
            self.assertIn(needle, r.stdout + r.stderr, args)

    def test_metrics_tls_and_data_roots_refusals_name_the_flags(self):
        cases = [
            # One of the pair: both are named.
            (["--metrics_tls_cert=" + PKI.server_cert], ["--metrics_tls_cert", "--metrics_tls_key"]),
            (["--metrics_tls_key=" + PKI.server_key], ["--metrics_tls_cert", "--metrics_tls_key"]),
            (["--metrics_tls_cert=" + PKI.server_cert, "--metrics_tls_key=" + PKI.w1_key],
             ["--metrics_tls_key: " + PKI.w1_key, "not the private key"]),
            (["--metrics_tls_cert=/nonexistent/m.pem", "--metrics_tls_key=" + PKI.server_key],
             ["--metrics_tls_cert: cannot read /nonexistent/m.pem"]),
            (["--metrics_tls_cert=" + PKI.auth_tokens, "--metrics_tls_key=" + PKI.server_key],
             ["--metrics_tls_cert: " + PKI.auth_tokens, "no PEM certificate"]),
            (["--data_roots=" + PKI.dir + ",/nonexistent/corpora"],
             ["--data_roots: /nonexistent/corpora"]),
        ]
        for args, needles in cases:
            r = self.start(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr[-500:]))
            for needle in needles:
                self.assertIn(needle, r.stdout + r.stderr, args)


class MetricsTlsTest(SecureCluster):
    """/metrics and /healthz over HTTPS (--metrics_tls_cert/--metrics_tls_key,
    here the gRPC server's own pair); nothing secret in the scrape."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_sec_metrics_")
        self.auth_tokens = os.path.join(self.dir, "users.yaml")
        shutil.copy(PKI.auth_tokens, self.auth_tokens)
        self.tallyd = Tallyd(self.dir, secure_args(PKI, self.auth_tokens) + [
            "--metrics_tls_cert=" + PKI.server_cert, "--metrics_tls_key=" + PKI.server_key,
            "--job_info_labels=team"], ca_cert=PKI.ca, token=PKI.tokens["ops"])

    def fetch(self, scheme, path, cafile):
        ctx = ssl.create_default_context(cafile=cafile)
        url = "%s://%s%s" % (scheme, self.tallyd.metrics_addr, path)
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return r.headers.get("Content-Type"), r.read().decode()

    def test_scrape_over_https_holds_no_secret(self):
        # Jobs and an experiment, by callers of each kind, so per-job and
        # per-caller series exist.
        alice = self.stubs(PKI.tokens["alice"])
        s = spec()
        s.labels["team"] = "nlp"
        alice[0].SubmitJob(jobs_pb2.SubmitJobRequest(spec=s), timeout=10)
        alice[1].CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=experiment_spec()), timeout=10)
        jwt_jobs, _ = self.stubs(PKI.jwt("carol", "research", "user"))
        jwt_jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        with self.assertRaises(grpc.RpcError):
            self.stubs("not-a-token")[0].ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        wait_for(lambda: "tally_job_info{" in self.fetch("https", "/metrics", PKI.ca)[1],
                 what="the job's series")

        content_type, body = self.fetch("https", "/metrics", PKI.ca)
        self.assertTrue(content_type.startswith("text/plain; version=0.0.4"), content_type)
        series = parse_exposition(body)
        self.assertIn("# TYPE grpc_server_handled_total counter", body)
        self.assertTrue(any(k.startswith("tally_build_info{") for k in series), body[:500])
        self.assertTrue(any(k.startswith("tally_job_info{") for k in series), body[:500])
        self.assertEqual(self.fetch("https", "/healthz", PKI.ca)[1], "ok\n")
        # No token, token hash, JWT or credential file path anywhere in it.
        with open(self.auth_tokens) as f:
            hashes = set(re.findall(r"[0-9a-f]{64}", f.read()))
        with open(PKI.worker_tokens) as f:
            hashes |= set(re.findall(r"[0-9a-f]{64}", f.read()))
        self.assertEqual(len(hashes), 7)
        secrets = hashes | set(PKI.tokens.values()) | {h[:16] for h in hashes}
        for secret in sorted(secrets):
            self.assertNotIn(secret, body)
        for path in (PKI.dir, self.auth_tokens, PKI.server_key, PKI.jwks):
            self.assertNotIn(path, body)
        self.assertNotIn("eyJ", body)  # the start of every JWT
        # No label holds a file path (datasets, credentials, checkpoints).
        # Display names are the user's own text ("sec/timing", an
        # experiment's calibration job).
        values = [v for key in series
                  for name, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', key)
                  if name != "display_name"]
        self.assertTrue(values)
        self.assertEqual([v for v in values if "/" in v and not v.startswith("tally.v1.")
                          and not v.startswith("jobs/") and not v.startswith("experiments/")],
                         [])

    def test_plain_http_and_another_ca_are_refused(self):
        with self.assertRaises((OSError, http.client.HTTPException)):
            self.fetch("http", "/metrics", PKI.ca)
        with self.assertRaises(urllib.error.URLError) as err:
            self.fetch("https", "/metrics", PKI.other_ca)
        self.assertIsInstance(err.exception.reason, ssl.SSLCertVerificationError)
        # Still serving after both.
        self.assertIn("tally_build_info", self.fetch("https", "/metrics", PKI.ca)[1])


class DataRootsTest(unittest.TestCase):
    """--data_roots: SubmitJob and CreateExperiment refuse specs whose
    datasets resolve outside the roots, naming the field (and the variant)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_sec_roots_")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.root = os.path.join(self.dir, "data")
        os.makedirs(self.root)
        # A link inside the root that leads out of it.
        os.symlink(PKI.dir, os.path.join(self.root, "out"))
        self.tallyd = Tallyd(self.dir, ["--data_roots=%s,%s" % (os.path.dirname(TRAIN_PATH),
                                                              self.root)])
        self.addCleanup(self.tallyd.stop)

    def submit(self, train_path, val_path=""):
        s = spec()
        s.data.train_path = train_path
        s.data.val_path = val_path
        return self.tallyd.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=s), timeout=10)

    def refused(self, call):
        with self.assertRaises(grpc.RpcError) as err:
            call()
        self.assertEqual(err.exception.code(), CODE.INVALID_ARGUMENT, err.exception.details())
        return err.exception.details()

    def test_escaping_paths_are_refused_and_inside_ones_accepted(self):
        job = self.submit(TRAIN_PATH)
        self.assertEqual(job.state, jobs_pb2.JOB_STATE_QUEUED)
        self.submit(os.path.join(self.root, "not-yet", "train"))  # need not exist yet
        roots = "(%s, %s)" % (os.path.dirname(TRAIN_PATH), self.root)
        cases = [
            (os.path.join(self.root, "..", "..", "etc", "x"), "",
             "spec.data.train_path", os.path.normpath(os.path.join(self.dir, "..", "etc", "x"))),
            (os.path.join(self.root, "out", "users"), "",
             "spec.data.train_path", os.path.join(PKI.dir, "users")),
            ("/etc/passwd", "", "spec.data.train_path", "/etc/passwd"),
            (TRAIN_PATH, os.path.join(self.root, "out", "ca"),
             "spec.data.val_path", os.path.join(PKI.dir, "ca")),
        ]
        for train, val, field, resolved in cases:
            details = self.refused(lambda: self.submit(train, val))
            given = val or train
            # What the caller sent and the roots as configured; never what
            # the path resolves to on tallyd's host.
            self.assertIn('%s "%s" is outside tallyd\'s --data_roots %s'
                          % (field, given, roots), details)
            if resolved not in given:
                self.assertNotIn(resolved, details)
            self.assertIn("put the dataset under a data root", details)
        # Nothing refused was queued.
        self.assertEqual(len(self.tallyd.jobs.ListJobs(jobs_pb2.ListJobsRequest(),
                                                       timeout=10).jobs), 2)

    def test_experiment_variants_are_checked_after_their_overrides(self):
        e = experiment_spec()
        self.tallyd.experiments.CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=e), timeout=10)
        e.variants[1].overrides.update({"data": {"train_path": "/etc/x"}})
        details = self.refused(lambda: self.tallyd.experiments.CreateExperiment(
            experiments_pb2.CreateExperimentRequest(spec=e), timeout=10))
        self.assertIn('variants[1] (b): spec.data.train_path "/etc/x" is outside '
                      "tallyd's --data_roots", details)


if __name__ == "__main__":
    unittest.main()
