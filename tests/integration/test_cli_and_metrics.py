"""tallyctl against a real tallyd, and the /metrics exposition checked by
promtool on a live scrape."""

import json
import os
import re
import signal
import subprocess
import unittest

import tempfile

from harness import ROOT, TRAIN_PATH, ClusterTest, jobs_pb2, parse_exposition, spec, wait_for

EXAMPLE = os.path.join(ROOT, "examples", "jobs", "tiny.yaml")


def _tiny_on_test_corpus():
    """examples/jobs/tiny.yaml, pointed at the test corpus."""
    with open(EXAMPLE) as f:
        text = f.read()
    assert "build/demo/fortunes/train" in text
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text.replace("build/demo/fortunes/train", TRAIN_PATH))
    return path


TINY = _tiny_on_test_corpus()


class TallyctlTest(ClusterTest):

    def test_submit_watch_get_list_cancel(self):
        self.add_worker("w1")
        r = self.tallyctl("submit", "-f", TINY)
        self.assertEqual(r.returncode, 0, r.stderr)
        name = r.stdout.strip()
        self.assertRegex(name, r"^jobs/\d+$")
        w = self.tallyctl("watch", name)
        self.assertEqual(w.returncode, 0, w.stderr)  # SUCCEEDED
        self.assertIn("succeeded", w.stdout)
        self.assertNotIn("\r", w.stdout, "no progress bar when not a terminal")
        g = self.tallyctl("get", name, "--output=json")
        self.assertEqual(g.returncode, 0, g.stderr)
        job = json.loads(g.stdout)
        self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(job["spec"]["display_name"], "tiny-packed")
        self.assertEqual(job["spec"]["labels"], {"team": "research"})
        # Every field, zeros included: the step-0 evaluation has its "step".
        self.assertEqual(job["curve"][0]["step"], "0")
        lst = self.tallyctl("list", "--state=succeeded")
        self.assertEqual(lst.returncode, 0, lst.stderr)
        self.assertIn(name, lst.stdout)
        c = self.tallyctl("cancel", name)
        self.assertEqual(c.returncode, 4, "cancelling an ended job: wrong state")
        self.assertIn("already ended", c.stderr)

    def test_watch_exit_code_for_a_cancelled_job(self):
        r = self.tallyctl("submit", "-f", TINY)
        name = r.stdout.strip()
        self.assertEqual(self.tallyctl("cancel", name, "--reason=test").returncode, 0)
        w = self.tallyctl("watch", name)
        self.assertEqual(w.returncode, 6, w.stdout + w.stderr)
        self.assertIn("cancelled: test", w.stdout)

    def test_errors_name_the_problem_and_exit_codes_mean_something(self):
        bad = "model: {num_layers: 2, d_model: 64, num_heads: 4}\nbogus: 1\n"
        r = self.tallyctl("submit", "-f", "-", stdin=bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("spec.bogus", r.stderr)
        invalid = "model: {num_layers: 0, d_model: 64, num_heads: 4}\n"
        r = self.tallyctl("submit", "-f", "-", stdin=invalid)
        self.assertEqual(r.returncode, 2)
        self.assertIn("spec.model.num_layers", r.stderr)
        # An explicit 0 is never replaced by the default: it is refused.
        zero_lr = ("model: {num_layers: 2, d_model: 64, num_heads: 4}\n"
                   "data: {train_path: /data/corpus, seq_len: 128}\n"
                   "training: {max_steps: 10}\noptimizer: {lr: 0}\n")
        r = self.tallyctl("validate", "-f", "-", stdin=zero_lr)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("spec.optimizer.lr", r.stderr)
        self.assertEqual(self.tallyctl("get", "jobs/999").returncode, 3)
        self.assertEqual(self.tallyctl("submit", "-f", "/nonexistent.yaml").returncode, 3)
        self.assertEqual(self.tallyctl("frobnicate").returncode, 2)
        r = self.tallyctl("sumbit", "-f", TINY)
        self.assertEqual(r.returncode, 2)
        self.assertIn('unknown command "sumbit"; did you mean "submit"?', r.stderr)
        self.assertEqual(self.tallyctl("list", "--state=sleepy").returncode, 2)
        env = dict(os.environ, TALLY_CONTROLLER="127.0.0.1:1")
        from harness import TALLYCTL
        down = subprocess.run([TALLYCTL, "list", "--timeout=1s"], capture_output=True,
                              text=True, env=env, timeout=30)
        self.assertEqual(down.returncode, 5)
        self.assertIn("127.0.0.1:1", down.stderr)
        v = self.tallyctl("validate", "-f", TINY)
        self.assertEqual(v.returncode, 0, v.stderr)

    def test_watch_rides_through_a_tallyd_restart(self):
        self.add_worker("w1")
        name = self.tallyctl("submit", "-f", TINY).stdout.strip()
        env = dict(os.environ, TALLY_CONTROLLER=self.tallyd.grpc_addr)
        from harness import TALLYCTL
        watch = subprocess.Popen([TALLYCTL, "watch", name], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        self.wait_state(name, jobs_pb2.JOB_STATE_RUNNING)
        # The watch is under way once it has shown an event; a tallyctl still
        # starting up would meet the restarted tallyd and have nothing to resume.
        first = watch.stdout.readline()
        self.assertTrue(first.startswith("#"), first)
        self.tallyd.kill(signal.SIGTERM)
        self.tallyd.start()  # same ports
        out, err = watch.communicate(timeout=120)
        out = first + out
        self.assertEqual(watch.returncode, 0, out + err)
        self.assertIn("resuming after event", err)
        seqs = [int(l.split()[0][1:]) for l in out.splitlines() if l.startswith("#")]
        self.assertEqual(seqs, sorted(set(seqs)), "no event shown twice")
        self.assertIn("succeeded", out)

    def test_get_shows_capacity_and_preemption_limit_only_when_set(self):
        # No worker: the jobs stay queued, never preempted.
        plain = self.tallyctl("submit", "-f", TINY).stdout.strip()
        g = self.tallyctl("get", plain)
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertIn("  resources: 1 x cpu, priority 0\n", g.stdout)
        self.assertRegex(g.stdout, r"  progress:  step 0 / 200, attempt \d+ of 3\n")
        for absent in ("capacity", "preemption", "spot"):
            self.assertNotIn(absent, g.stdout)
        with open(TINY) as f:
            text = f.read()
        self.assertIn("  gpu_count: 1\n", text)
        text = text.replace("  gpu_count: 1\n", "  gpu_count: 1\n  capacity: on_demand\n")
        r = self.tallyctl("submit", "-f", "-", stdin=text + "max_preemptions: 2\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        g = self.tallyctl("get", r.stdout.strip())
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertIn("  resources: 1 x cpu, priority 0, on-demand capacity\n", g.stdout)
        self.assertRegex(g.stdout, r"  progress:  .*, at most 2 preemptions\n")
        self.assertNotIn("preemptions:", g.stdout, "never preempted")
        # Without a spot price in tallyd's config, the estimate says nothing
        # of spot.
        e = self.tallyctl("estimate", "-f", TINY)
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertRegex(e.stdout, r"^\$\d+\.\d{4}: .* GPU-hours at \$[\d.]+/GPU-hour\n$")

    def test_request_id_flag_is_idempotent(self):
        a = self.tallyctl("submit", "-f", TINY, "--request_id=fixed-1").stdout.strip()
        b = self.tallyctl("submit", "-f", TINY, "--request_id=fixed-1").stdout.strip()
        self.assertEqual(a, b)


class MetricsTest(ClusterTest):

    def test_live_scrape_passes_promtool_and_counts_what_happened(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=5))
        self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED)
        with self.assertRaises(Exception):
            self.get("jobs/4242")
        text = self.tallyd.scrape()
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout + check.stderr, "", "promtool has no complaints")
        s = parse_exposition(text)
        self.assertEqual(s['tally_jobs{state="succeeded"}'], 1)
        self.assertEqual(s['tally_jobs{state="queued"}'], 0)
        self.assertEqual(s["tally_queue_depth"], 0)
        self.assertEqual(s['tally_workers{gpu_type="cpu",state="connected"}'], 1)
        self.assertEqual(s['tally_worker_slots{gpu_type="cpu",state="free"}'], 1)
        self.assertEqual(s['tally_queue_wait_seconds_count'], 1)
        self.assertEqual(s['tally_attempts_ended_total{outcome="succeeded"}'], 1)
        jobs_method = 'grpc_method="%s",grpc_service="tally.v1.Jobs",grpc_type="unary"'
        self.assertGreaterEqual(
            s['grpc_server_handled_total{grpc_code="OK",%s}' % (jobs_method % "SubmitJob")], 1)
        self.assertGreaterEqual(
            s['grpc_server_handled_total{grpc_code="NotFound",%s}' % (jobs_method % "GetJob")], 1)
        self.assertEqual(s['grpc_server_handling_seconds_bucket{%s,le="+Inf"}'
                         % (jobs_method % "SubmitJob")], 1)
        # An ended job's series keep their final values (--job_metrics_retention).
        self.assertEqual(s['tally_job_step{tally_job="%s"}' % job.name], 5)
        self.assertEqual(s['tally_job_info{display_name="test",gpu_type="cpu",state="succeeded",'
                           'tally_job="%s"}' % job.name], 1)
        # No series appears twice.
        keys = [l.rsplit(" ", 1)[0] for l in text.splitlines() if l and l[0] != "#"]
        self.assertEqual(len(keys), len(set(keys)))


class JobMetricsTest(ClusterTest):

    def test_running_jobs_export_their_series_and_keep_them_when_they_end(self):
        self.add_worker("w1")
        s = spec(max_steps=100000, name="metrics")
        s.model.d_model = 32
        s.training.eval_interval_steps = 50
        s.training.eval_tokens = 2048
        s.training.eval_quantized = "q8_0"  # a quantized loss beside val_loss
        s.early_stopping.patience = 1000
        s.budget.max_dollars = 100
        job = self.submit(s)
        wait_for(lambda: self.get(job.name).early_stopping.evals >= 2, timeout=60,
                 what="two evaluations")
        text = self.tallyd.scrape()
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        series = parse_exposition(text)
        label = '{tally_job="%s"}' % job.name
        for name in ("tally_job_step", "tally_job_train_loss", "tally_job_val_loss",
                     "tally_job_best_val_loss", "tally_job_cost_dollars",
                     "tally_job_patience_left", "tally_job_useful_tokens_per_second",
                     "tally_job_padding_fraction", "tally_job_budget_used_ratio"):
            self.assertIn(name + label, series, name)
        self.assertIn('tally_job_tokens_total{kind="useful",tally_job="%s"}' % job.name, series)
        self.assertGreater(series["tally_job_step" + label], 0)
        self.assertEqual(series["tally_job_patience_left" + label],
                         self.get(job.name).early_stopping.patience_left)
        self.assertIn("tally_job_quantized_val_loss" + label, series)
        self.assertGreater(series["tally_job_quantized_val_loss" + label], 0)
        # tallyctl shows the quantized loss beside val_loss, as the format's.
        g = self.tallyctl("get", job.name)
        self.assertEqual(g.returncode, 0, g.stderr)
        self.assertRegex(g.stdout, r"val loss:  latest [0-9.]+ \(q8_0: [0-9.]+\), best ")
        self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name), timeout=10)
        w = self.tallyctl("watch", job.name)
        evals = [l for l in w.stdout.splitlines() if " eval " in l]
        self.assertTrue(evals, w.stdout)
        for line in evals:
            self.assertRegex(line, r"val_loss [0-9.]+ \(q8_0: [0-9.]+\)")
        after = self.tallyd.scrape()
        ended = parse_exposition(after)
        self.assertEqual(ended['tally_job_info{display_name="metrics",gpu_type="cpu",'
                               'state="cancelled",tally_job="%s"}' % job.name], 1,
                         "an ended job's series stay, with its terminal state")
        self.assertNotIn('tally_job_info{display_name="metrics",gpu_type="cpu",'
                         'state="running",tally_job="%s"}' % job.name, ended)
        self.assertIn('tally_early_stops_total{rule="patience"} 0', after)


    def test_ended_jobs_series_survive_a_tallyd_restart(self):
        self.add_worker("w1")
        job = self.submit(spec(max_steps=5, name="restart"))
        self.wait_state(job.name, jobs_pb2.JOB_STATE_SUCCEEDED)
        info = ('tally_job_info{display_name="restart",gpu_type="cpu",state="succeeded",'
                'tally_job="%s"}' % job.name)
        step = 'tally_job_step{tally_job="%s"}' % job.name
        ended = 'tally_job_attempts_ended_total{outcome="succeeded",tally_job="%s"}' % job.name
        before = parse_exposition(self.tallyd.scrape())
        self.assertEqual((before[info], before[step], before[ended]), (1, 5, 1))
        self.tallyd.restart()  # SIGKILL, then the same data directory
        after = parse_exposition(self.tallyd.scrape())
        self.assertEqual(after.get(info), 1, "the ended job's info is back")
        self.assertEqual(after.get(step), 5, "with its final values")
        self.assertEqual(after.get(ended), 1, "and its counters where they were")


if __name__ == "__main__":
    unittest.main()
