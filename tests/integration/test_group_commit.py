"""Group commit under kill -9: tallyd is killed while many clients submit at
once (their writes share transactions), and after the restart every
acknowledged submit is there as acknowledged; a submit cut off by the kill
either made its job or made none, and resubmitting its request id settles
which without a duplicate."""

import signal
import threading
import unittest

import grpc
from harness import ClusterTest, Tallyd, jobs_pb2, spec, wait_for

CLIENTS = 32


class GroupCommitKillTest(ClusterTest):

    def run_kill_9(self, group_commit):
        self.tallyd.stop()
        self.tallyd = Tallyd(self.dir, ["--group_commit=%s" % group_commit])
        acked = {}        # request_id -> Job as acknowledged
        cut_off = set()   # request_ids whose submit got no answer
        lock = threading.Lock()
        stop = threading.Event()

        def client(c):
            stub = self.tallyd.jobs
            for i in range(100000):
                if stop.is_set():
                    return
                rid = "gc-%d-%d" % (c, i)
                try:
                    job = stub.SubmitJob(jobs_pb2.SubmitJobRequest(
                        spec=spec(max_steps=5, name=rid), request_id=rid), timeout=10)
                except grpc.RpcError:
                    with lock:
                        cut_off.add(rid)
                    return
                with lock:
                    acked[rid] = job

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 300, timeout=60, what="300 acknowledged submits")
        self.assertEqual(self.tallyd.kill(signal.SIGKILL), -signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        self.tallyd.start()

        for rid, job in acked.items():
            got = self.get(job.name)
            self.assertEqual(got.request_id, rid)
            self.assertEqual(got.spec, job.spec)
            self.assertEqual(got.create_time, job.create_time)
            self.assertEqual(got.state, jobs_pb2.JOB_STATE_QUEUED)
        # A repeated request id names the acknowledged job, not a new one.
        for rid in sorted(acked)[:20]:
            again = self.submit(spec(max_steps=5, name=rid), request_id=rid)
            self.assertEqual(again.name, acked[rid].name)
        # A cut-off submit is either whole or absent: resubmitting it makes
        # exactly one job.
        for rid in cut_off:
            self.submit(spec(max_steps=5, name=rid), request_id=rid)
        jobs, token = [], ""
        while True:
            page = self.tallyd.jobs.ListJobs(
                jobs_pb2.ListJobsRequest(page_size=500, page_token=token), timeout=10)
            jobs += list(page.jobs)
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(len(jobs), len(set(j.name for j in jobs)))
        listed = {}
        for j in jobs:
            listed.setdefault(j.request_id, []).append(j.name)
        for rid, jobs in listed.items():
            self.assertEqual(len(jobs), 1, "request id %s made %s" % (rid, jobs))
        for rid in list(acked) + list(cut_off):
            self.assertIn(rid, listed)

    def test_kill_9_during_concurrent_submits_loses_nothing_acknowledged(self):
        self.run_kill_9("true")

    def test_kill_9_during_concurrent_submits_one_commit_per_submit(self):
        self.run_kill_9("false")


if __name__ == "__main__":
    unittest.main()
