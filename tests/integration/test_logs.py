"""Job logs end to end: a real job on a real worker, its output read back
with tallyctl logs (a page, filters, --tail, JSON) and followed with
--follow while it runs; GetJobLogs and WatchJobLogs over gRPC; the
/metrics series."""

import json
import os
import subprocess
import unittest

from harness import TALLYCTL, ClusterTest, jobs_pb2, spec


class LogsTest(ClusterTest):

    def test_tallyctl_logs_of_a_finished_job(self):
        self.add_worker("w1")
        name = self.submit(spec(max_steps=20)).name
        self.wait_state(name, {jobs_pb2.JOB_STATE_SUCCEEDED})
        r = self.tallyctl("logs", name)
        self.assertEqual(r.returncode, 0, r.stderr)
        # The trainer's own line and the worker's lines about the attempt.
        self.assertRegex(r.stdout, r"a1 r0 info    %s attempt 1: \d+ parameters" % name)
        self.assertIn("[worker] attempt 1 of %s: started on worker w1" % name, r.stdout)
        self.assertIn("[worker] attempt 1 of %s: ATTEMPT_OUTCOME_SUCCEEDED" % name, r.stdout)
        # Filters: another attempt has nothing; --tail keeps the last lines.
        other = self.tallyctl("logs", name, "--attempt=2")
        self.assertEqual(other.returncode, 0, other.stderr)
        self.assertEqual(other.stdout, "")
        tail = self.tallyctl("logs", name, "--tail=1")
        self.assertEqual(tail.returncode, 0, tail.stderr)
        self.assertEqual(tail.stdout.splitlines(), r.stdout.splitlines()[-1:])
        since = self.tallyctl("logs", name, "--since=10m", "--rank=0")
        self.assertEqual(since.stdout, r.stdout)
        js = self.tallyctl("logs", name, "--output=json")
        lines = [json.loads(l) for l in js.stdout.splitlines()]
        self.assertEqual(len(lines), len(r.stdout.splitlines()))
        seqs = [int(l["sequence"]) for l in lines]
        self.assertEqual(seqs, sorted(seqs))
        self.assertTrue(all(l["time"] for l in lines))
        # gRPC: a page of two, then the rest after the last sequence.
        page = self.tallyd.jobs.GetJobLogs(
            jobs_pb2.GetJobLogsRequest(name=name, page_size=2), timeout=10)
        self.assertEqual(len(page.lines), 2)
        self.assertTrue(page.more)
        rest = self.tallyd.jobs.GetJobLogs(jobs_pb2.GetJobLogsRequest(
            name=name, selector=jobs_pb2.LogSelector(after_sequence=page.lines[-1].sequence)),
            timeout=10)
        self.assertEqual(len(page.lines) + len(rest.lines), len(lines))
        # Usage errors and unknown jobs.
        bad = self.tallyctl("logs", name, "--tail=-1")
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--tail", bad.stderr)
        missing = self.tallyctl("logs", "jobs/999")
        self.assertEqual(missing.returncode, 3, missing.stderr)
        # The counters moved, by source.
        self.assertGreaterEqual(self.metric("tally_job_log_lines_total", source="trainer"), 1)
        self.assertGreaterEqual(self.metric("tally_job_log_lines_total", source="worker"), 2)
        self.assertEqual(self.metric("tally_job_log_dropped_bytes_total", by="tallyd"), 0)

    def test_follow_while_it_runs_then_ends_with_the_job(self):
        name = self.submit(spec(max_steps=400)).name
        env = dict(os.environ, TALLY_CONTROLLER=self.tallyd.grpc_addr)
        follow = subprocess.Popen([TALLYCTL, "logs", name, "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        try:
            self.add_worker("w1")  # the job starts only now: the watch came first
            out, err = follow.communicate(timeout=120)
        finally:
            if follow.poll() is None:
                follow.kill()
        self.assertEqual(follow.returncode, 0, err)
        self.assertIn(self.get(name).state, {jobs_pb2.JOB_STATE_SUCCEEDED})
        self.assertRegex(out, r"%s attempt 1: \d+ parameters" % name)
        self.assertIn("ATTEMPT_OUTCOME_SUCCEEDED", out)
        # What --follow printed is what a page shows afterwards.
        page = self.tallyctl("logs", name)
        self.assertEqual(out, page.stdout)
        # WatchJobLogs resumed after a sequence sends only what follows.
        watched = list(self.tallyd.jobs.WatchJobLogs(jobs_pb2.WatchJobLogsRequest(
            name=name, selector=jobs_pb2.LogSelector(after_sequence=2)), timeout=30))
        self.assertEqual(len(watched), len(out.splitlines()) - 2)
        self.assertEqual(watched[0].sequence, 3)


if __name__ == "__main__":
    unittest.main()
