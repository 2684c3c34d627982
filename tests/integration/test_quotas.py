"""Tenant quotas with a real tallyd and real workers: max_gpus holds a
tenant's jobs back, a daily dollar cap stops its running job and refuses its
next submit, and the metrics show spend and quota."""

import hashlib
import os
import shutil
import tempfile
import unittest

from harness import (Tallyd, Worker, jobs_pb2, spec, wait_for, grpc, parse_exposition,
                     TERMINAL)

TOKENS = {"alice": ("research", "tok-alice-quota"), "bob": ("dev", "tok-bob-quota")}


def write_users(path):
    with open(path, "w") as f:
        f.write("principals:\n")
        for name, (tenant, token) in TOKENS.items():
            f.write('  - {name: %s, tenant: %s, role: user, token_sha256: "%s"}\n'
                    % (name, tenant, hashlib.sha256(token.encode()).hexdigest()))


class QuotaTest(unittest.TestCase):

    def start(self, config, workers=1):
        self.dir = tempfile.mkdtemp(prefix="tally_quota_")
        self.addCleanup(shutil.rmtree, self.dir, True)
        users = os.path.join(self.dir, "users.yaml")
        write_users(users)
        cfg = os.path.join(self.dir, "tallyd.yaml")
        with open(cfg, "w") as f:
            f.write(config)
        self.tallyd = Tallyd(self.dir, ["--auth_tokens=" + users, "--config=" + cfg],
                             token=TOKENS["alice"][1])
        self.workers = [Worker(self.tallyd.grpc_addr, "w%d" % i, self.dir)
                        for i in range(workers)]

        def cleanup():
            for w in self.workers:
                w.kill()
            self.tallyd.stop()
        self.addCleanup(cleanup)
        self.jobs = {}
        for name in TOKENS:
            ch = self.tallyd.open_channel(token=TOKENS[name][1])
            self.addCleanup(ch.close)
            from tally.v1 import jobs_pb2_grpc
            self.jobs[name] = jobs_pb2_grpc.JobsStub(ch)

    def submit(self, who, s):
        return self.jobs[who].SubmitJob(jobs_pb2.SubmitJobRequest(spec=s), timeout=10)

    def get(self, who, name):
        return self.jobs[who].GetJob(jobs_pb2.GetJobRequest(name=name), timeout=10)

    def test_max_gpus_holds_a_tenants_second_job_until_the_first_ends(self):
        self.start("usd_per_gpu_hour: {cpu: 0.05}\ntenants:\n  research: {max_gpus: 1}\n",
                   workers=2)
        first = self.submit("alice", spec(max_steps=60, name="first"))
        second = self.submit("alice", spec(max_steps=20, name="second"))
        other = self.submit("bob", spec(max_steps=20, name="other"))
        wait_for(lambda: self.get("alice", first.name).state == jobs_pb2.JOB_STATE_RUNNING,
                 what="the first job to run")
        wait_for(lambda: "max_gpus" in self.get("alice", second.name).state_reason,
                 what="the second job to say it waits for the quota")
        job = self.get("alice", second.name)
        self.assertEqual(job.state, jobs_pb2.JOB_STATE_QUEUED)
        self.assertIn("tenant research is at its max_gpus 1", job.state_reason)
        # bob's tenant has no quota: it runs on the other worker meanwhile.
        wait_for(lambda: self.get("bob", other.name).state in
                 (jobs_pb2.JOB_STATE_RUNNING, jobs_pb2.JOB_STATE_SUCCEEDED),
                 what="the other tenant's job to run")
        m = parse_exposition(self.tallyd.scrape())
        self.assertEqual(m.get('tally_tenant_gpus{state="quota",tenant="research"}'), 1)
        wait_for(lambda: self.get("alice", second.name).state == jobs_pb2.JOB_STATE_SUCCEEDED,
                 timeout=120, what="the second job to run once the first ended")
        self.assertEqual(self.get("alice", first.name).state, jobs_pb2.JOB_STATE_SUCCEEDED)

    def test_a_daily_cap_stops_the_running_job_and_refuses_the_next_submit(self):
        # 36 $/h: a cent a second; research may spend 3 cents a day.
        self.start("usd_per_gpu_hour: {cpu: 36}\n"
                   "tenants:\n  research: {max_dollars_per_day: 0.03}\n")
        job = self.submit("alice", spec(max_steps=100000, name="long"))
        ended = wait_for(lambda: (lambda j: j if j.state in TERMINAL else None)(
            self.get("alice", job.name)), timeout=60, what="the job to be stopped")
        self.assertEqual(ended.state, jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED)
        self.assertIn("tenant quota: research spent $0.03", ended.state_reason)
        self.assertIn("max_dollars_per_day is $0.03", ended.state_reason)
        with self.assertRaises(grpc.RpcError) as err:
            self.submit("alice", spec(max_steps=10))
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("max_dollars_per_day", err.exception.details())
        self.submit("bob", spec(max_steps=10))  # another tenant is not capped
        m = parse_exposition(self.tallyd.scrape())
        self.assertGreaterEqual(m['tally_tenant_spend_usd{tenant="research",window="day"}'], 0.03)
        self.assertEqual(m['tally_tenant_quota_usd{tenant="research",window="day"}'], 0.03)
        self.assertEqual(
            m['tally_job_ends_total{reason_rule="tenant_quota",state="budget_exhausted"}'], 1)
        # A restart keeps the spend: still refused.
        self.tallyd.restart()  # its own channel sends alice's token

        def refused():
            try:
                self.tallyd.jobs.SubmitJob(
                    jobs_pb2.SubmitJobRequest(spec=spec(max_steps=10)), timeout=10)
                return "accepted"
            except grpc.RpcError as e:
                # UNAVAILABLE while the new process's port settles: ask again.
                return None if e.code() == grpc.StatusCode.UNAVAILABLE else e.code()
        self.assertEqual(wait_for(refused, what="an answer after the restart"),
                         grpc.StatusCode.RESOURCE_EXHAUSTED)

if __name__ == "__main__":
    unittest.main()
