"""The dashboards and alert rules in deploy/ against a real Prometheus
(Debian's) scraping a real tallyd while real jobs run: every panel's PromQL
returns data, every rule evaluates, an ended job's final values stay
queryable, the alerts the run produces on purpose fire (budget, a worker
killed with SIGKILL, FP8 overflows and a routing collapse forced by the
worker's test-only flags) for the job that produced them and for no other,
and the other alerts do not fire. The live rules are deploy's, with one
change: TallyFp8Overflows' `for:` is cut from minutes to seconds (its
expression is unchanged). Alerts whose condition takes minutes to produce
live (failed jobs, divergence, a stuck queue) are tested with `promtool test
rules` on deploy/prometheus/alerts_test.yaml, each firing and each near miss
not; so is every alert's `for:`."""

import glob
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

from harness import ROOT, TERMINAL, ClusterTest, jobs_pb2, spec, spec_pb2, wait_for

DEPLOY = os.path.join(ROOT, "deploy")
DASHBOARDS = sorted(glob.glob(os.path.join(DEPLOY, "grafana", "*.json")))
# Dashboards whose every panel the Prometheus test below sees return data.
# experiment.json needs an experiment running; its panels are checked
# statically (ExperimentDashboardTest).
LIVE_DASHBOARDS = [os.path.join(DEPLOY, "grafana", n) for n in ("fleet.json", "job.json")]
RULES = os.path.join(DEPLOY, "prometheus", "alerts.yaml")
RULE_TESTS = os.path.join(DEPLOY, "prometheus", "alerts_test.yaml")
README = os.path.join(ROOT, "README.md")
# A worker whose test-only flags damage every job it runs: a fraction of each
# FP8 linear's inputs overflows, every token is routed to expert 0, and
# grouped FP8 expert products are off (as where CUDA refuses them). Its own
# GPU type keeps every other job off it.
FORCED_GPU_TYPE = "cpu-forced"
FORCED_WORKER_ARGS = ["--gpu_type=" + FORCED_GPU_TYPE, "--testonly_fp8_overflow_fraction=0.01",
                      "--testonly_moe_collapse_expert=0",
                      "--testonly_fp8_grouped_off=refused by the test"]


def readme_metrics():
    """The metric names in README.md's metric tables (the first column)."""
    with open(README) as f:
        text = f.read()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z0-9_]+)(?:\{[^`]*\})?`", line.split("|")[1]))
    return names


def live_rules(path):
    """deploy's alert rules, written to `path` with TallyFp8Overflows'
    `for:` cut to seconds, so that the live test can see it fire."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    found = [r for g in rules["groups"] for r in g["rules"]
             if r.get("alert") == "TallyFp8Overflows"]
    assert len(found) == 1 and "for" in found[0], "TallyFp8Overflows has a for:"
    found[0]["for"] = "2s"
    with open(path, "w") as f:
        yaml.safe_dump(rules, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def panel_exprs(path):
    with open(path) as f:
        d = json.load(f)
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p["targets"]]


class StaticTest(unittest.TestCase):

    def test_dashboards_load_as_file_provisioning_expects(self):
        for path in DASHBOARDS:
            with open(path) as f:
                text = f.read()
            d = json.loads(text)
            self.assertNotIn("${DS_", text, "no import-time inputs under file provisioning")
            self.assertNotIn("__inputs", d)
            self.assertTrue(d["uid"].startswith("tally-"))
            self.assertGreaterEqual(d["schemaVersion"], 30)
            variables = {v["name"]: v for v in d["templating"]["list"]}
            self.assertEqual(variables["datasource"]["type"], "datasource")
            self.assertEqual(variables["datasource"]["query"], "prometheus")
            ids = [p["id"] for p in d["panels"]]
            self.assertEqual(len(ids), len(set(ids)))
            for p in d["panels"]:
                self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
                self.assertTrue(p["targets"], p["title"])
        with open(os.path.join(DEPLOY, "grafana", "job.json")) as f:
            self.assertIn("job", {v["name"] for v in json.load(f)["templating"]["list"]})

    def test_every_panel_expression_parses(self):
        # promtool parses each expression as a recording rule, with the
        # dashboard variables replaced by a value.
        rules = {"groups": []}
        for path in DASHBOARDS:
            group = {"name": os.path.basename(path), "rules": []}
            for i, (title, expr) in enumerate(panel_exprs(path)):
                expr = re.sub(r"\$\{?(job|experiment)\}?", "x/1", expr)
                expr = expr.replace("$__range", "1h").replace("$__rate_interval", "1m")
                group["rules"].append({"record": "tally:panel_%d" % i, "expr": expr})
            rules["groups"].append(group)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            json.dump(rules, f)  # JSON is YAML
            f.flush()
            r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                               text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_panels_have_units_and_take_counters_through_rate_or_increase(self):
        for path in DASHBOARDS:
            with open(path) as f:
                d = json.load(f)
            for p in d["panels"]:
                self.assertTrue(p["fieldConfig"]["defaults"].get("unit"), (path, p["title"]))
                for t in p["targets"]:
                    # Every counter inside rate() or increase(): a raw counter
                    # resets with tallyd and means nothing on a graph.
                    for m in re.finditer(r"\b(\w+_total)\b", t["expr"]):
                        before = t["expr"][:m.start()]
                        self.assertRegex(before, r"(rate|increase)\($", (p["title"], t["expr"]))
                    if os.path.basename(path) == "job.json":
                        self.assertIn("{{tally_job}}", t["legendFormat"], p["title"])
                        self.assertIn('tally_job="$job"', t["expr"], p["title"])
                    # Aggregated so that two scraped tallyd replicas give one line:
                    # every selector inside a max/sum (a sort or count of one
                    # counts each variant once, not once per replica).
                    self.assertRegex(t["expr"],
                                     r"^(histogram_quantile\(\S+ |sort\(|count\(|sum\()?"
                                     r"(max|sum)( by |\()", (p["title"], t["expr"]))
                    # Windows follow the scrape interval and the zoom, never fixed.
                    for window in re.findall(r"\[([^\]]*)\]", t["expr"]):
                        self.assertIn(window, ("$__rate_interval", "$__range"),
                                      (p["title"], t["expr"]))

    def test_alert_rules_pass_their_unit_tests(self):
        r = subprocess.run(["promtool", "test", "rules", RULE_TESTS], capture_output=True,
                           text=True, timeout=120, cwd=os.path.dirname(RULE_TESTS))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(RULE_TESTS) as f:
            tested = set(re.findall(r"alertname: (\w+)", f.read()))
        with open(RULES) as f:
            defined = set(re.findall(r"- alert: (\w+)", f.read()))
        self.assertEqual(tested, defined, "every alert has a unit test")

    def test_alert_rules_and_scrape_config_pass_promtool(self):
        for args in (["check", "rules", RULES],
                     ["check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yaml")]):
            r = subprocess.run(["promtool"] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class ExperimentDashboardTest(unittest.TestCase):
    """deploy/grafana/experiment.json against the metric families tallyd
    exports for experiments (server/metrics)."""

    FAMILIES = {
        "tally_experiment_variant_cost_dollars",
        "tally_experiment_variant_val_loss",
        "tally_experiment_variant_cost_to_target_dollars",
        "tally_experiment_variant_recipe_cost_to_target_dollars",
        "tally_experiment_variant_reached_target",
        "tally_experiment_target_val_loss",
        "tally_experiment_cost_dollars",
    }

    def setUp(self):
        with open(os.path.join(DEPLOY, "grafana", "experiment.json")) as f:
            self.dashboard = json.load(f)

    def test_experiment_variable(self):
        self.assertEqual(self.dashboard["uid"], "tally-experiment")
        variables = {v["name"]: v for v in self.dashboard["templating"]["list"]}
        self.assertEqual(variables["experiment"]["query"]["query"],
                         "label_values(tally_experiment_variant_cost_dollars, experiment)")

    def test_panels_use_the_exported_families_for_the_chosen_experiment(self):
        used = set()
        for p in self.dashboard["panels"]:
            for t in p["targets"]:
                names = set(re.findall(r"\btally_[a-z_]+", t["expr"]))
                self.assertTrue(names, p["title"])
                self.assertLessEqual(names, self.FAMILIES, p["title"])
                self.assertIn('{experiment="$experiment"}', t["expr"], p["title"])
                used |= names
        self.assertEqual(used, self.FAMILIES)


class PrometheusTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: 36}\n"  # $0.01 a second
                    "worker_gpu_types: [%s]\n" % FORCED_GPU_TYPE)  # announced, not priced
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()
        self.prom_addr = "127.0.0.1:%d" % free_port()
        prom_config = os.path.join(self.dir, "prometheus.yaml")
        rules = os.path.join(self.dir, "alerts.yaml")
        live_rules(rules)
        with open(prom_config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [%s]\n"
                    "scrape_configs:\n"
                    "  - job_name: tallyd\n"
                    "    static_configs: [{targets: ['%s']}]\n" % (rules, self.tallyd.metrics_addr))
        self.prom_log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.prom = subprocess.Popen(
            ["prometheus", "--config.file=" + prom_config,
             "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"),
             "--web.listen-address=" + self.prom_addr],
            stdout=self.prom_log, stderr=subprocess.STDOUT)
        wait_for(self.prom_ready, timeout=60, what="prometheus to start")
        # Its first scrape comes seconds after it is ready: a job that ran
        # before would be seen only with its final values.
        wait_for(lambda: self.value('up{job="tallyd"}') == 1, timeout=30,
                 what="prometheus's first scrape of tallyd")

    def tearDown(self):
        self.prom.terminate()
        self.prom.wait(timeout=30)
        self.prom_log.close()
        super().tearDown()

    def api(self, path, **params):
        url = "http://%s/api/v1/%s?%s" % (self.prom_addr, path, urllib.parse.urlencode(params))
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read().decode())

    def prom_ready(self):
        try:
            with urllib.request.urlopen("http://%s/-/ready" % self.prom_addr, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr):
        return self.api("query", query=expr)["data"]["result"]

    def alerts(self, name, **labels):
        sel = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
        return self.query('ALERTS{alertname="%s",alertstate="firing"%s}'
                          % (name, "," + sel if sel else ""))

    def value(self, expr):
        r = self.query(expr)
        return float(r[0]["value"][1]) if r else None

    def settled(self, expr, ok, what, timeout=20):
        """The scraped value of `expr` once `ok(value)` holds: Prometheus
        scrapes every second, and on a loaded machine a later change can
        land a scrape or two after the one a test waited for."""
        got = []

        def check():
            got[:] = [self.value(expr)]
            return got[0] is not None and ok(got[0])
        try:
            wait_for(check, timeout=timeout, interval=0.5, what=what)
        except AssertionError:
            raise AssertionError("%s: %s read %r" % (what, expr, got[0] if got else None))
        return got[0]

    def firing_jobs(self, name):
        return sorted(a["metric"].get("tally_job", "") for a in self.alerts(name))

    def test_final_values_panels_and_alerts_against_a_live_run(self):
        started = time.monotonic()
        self.add_worker("w1")
        self.add_worker("wf", FORCED_WORKER_ARGS)
        # A finished job first: its final values must stay queryable.
        first = self.submit(spec(max_steps=5, name="first"))
        # Alongside, on the damaging worker, an FP8 MoE job whose overflows
        # and routing collapse are forced. It runs for some seconds (a few
        # dozen steps take under one): TallyFp8Overflows takes a rate, which
        # needs two of Prometheus's samples while the job's counters rise.
        f = spec(max_steps=300, name="forced", gpu_type=FORCED_GPU_TYPE)
        f.model.num_layers = 2
        f.model.d_model = 32
        f.model.moe.num_experts = 4
        f.model.moe.top_k = 2
        f.precision.compute = spec_pb2.PRECISION_FP8
        f.training.eval_interval_steps = 5
        f.training.eval_tokens = 2048
        forced = self.submit(f)
        self.wait_state(first.name, jobs_pb2.JOB_STATE_SUCCEEDED, timeout=60)
        s = spec(max_steps=1000000, name="observed", checkpoint_interval=25)
        s.model.num_layers = 2
        s.model.d_model = 32
        s.model.moe.num_experts = 4
        s.model.moe.top_k = 2
        s.model.moe.bias_balancing = True
        s.precision.compute = spec_pb2.PRECISION_FP8
        s.training.eval_interval_steps = 25
        s.training.eval_tokens = 2048
        s.training.eval_quantized = "q8_0"  # the loss panel's quantized series
        s.early_stopping.patience = 1000
        s.budget.max_dollars = 0.15  # 80% after 12 s at $0.01/s, exhausted at 15 s
        job = self.submit(s)
        # Two that end badly, each on purpose: one fails (its data is not
        # there), one diverges (a learning rate no model survives). They wait
        # behind the budget job, so Prometheus sees their counters at 0 first.
        bad = spec(max_steps=50, name="no-data", max_attempts=1)
        bad.data.train_path = "/nonexistent/corpus/train"
        failing = self.submit(bad)
        d = spec(max_steps=200, name="diverging")
        d.optimizer.lr = 10.0
        d.optimizer.min_lr = 10.0
        d.training.eval_interval_steps = 2
        d.training.eval_tokens = 1024
        d.early_stopping.divergence_factor = 1.2
        diverging = self.submit(d)
        wait_for(lambda: self.get(job.name).cost.cost_usd >= 0.125, timeout=90,
                 what="83% of the budget")
        wait_for(lambda: self.alerts("TallyJobBudgetAt80Percent", tally_job=job.name),
                 timeout=20, what="the budget alert to fire while the job runs")
        done = self.wait_state(job.name, jobs_pb2.JOB_STATE_BUDGET_EXHAUSTED, timeout=60)
        self.wait_state(failing.name, jobs_pb2.JOB_STATE_FAILED, timeout=60)
        diverged = self.wait_state(diverging.name, TERMINAL, timeout=60)
        self.assertEqual(diverged.state, jobs_pb2.JOB_STATE_EARLY_STOPPED, diverged.state_reason)
        self.assertEqual(diverged.early_stopping.stop_rule, "divergence")
        forced_done = self.wait_state(
            forced.name, {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED,
                          jobs_pb2.JOB_STATE_EARLY_STOPPED}, timeout=60)
        self.assertEqual(forced_done.state, jobs_pb2.JOB_STATE_SUCCEEDED,
                         forced_done.state_reason)
        # Grouped FP8 products turned off: one warning event for the attempt,
        # naming the worker's reason.
        grouped_off = [e.reason for e in self.events(forced.name)
                       if e.type == "warning" and "FP8 grouped" in e.reason]
        self.assertEqual(len(grouped_off), 1, grouped_off)
        self.assertIn("turned off for attempt 1", grouped_off[0])
        self.assertIn("refused by the test", grouped_off[0])
        self.assertEqual(self.get(forced.name).fp8_grouped_off_attempt, 1)

        # After they ended: final values, with the terminal state.
        wait_for(lambda: self.value('tally_job_info{tally_job="%s",state="budget_exhausted"}'
                                    % job.name) == 1, timeout=15, what="the job's final state")
        # Each read waits for the value it expects: the scrape that showed
        # the job's end may predate the others' (a loaded machine).
        self.settled('tally_job_step{tally_job="%s"}' % first.name, lambda v: v == 5,
                     "first's final step")
        self.settled('tally_job_info{tally_job="%s",state="succeeded",display_name="first"}'
                     % first.name, lambda v: v == 1, "first's final state")
        self.settled('tally_job_budget_used_ratio{tally_job="%s"}' % job.name,
                     lambda v: v >= 1.0, "the budget used")
        self.settled('tally_job_cost_dollars{tally_job="%s"}' % job.name,
                     lambda v: abs(v - done.cost.cost_usd) < 5e-7, "the job's final cost")
        self.settled('tally_job_step{tally_job="%s"}' % job.name, lambda v: v >= done.step,
                     "the job's final step")
        self.settled('tally_job_best_val_loss{tally_job="%s"}' % job.name,
                     lambda v: v == done.early_stopping.best_val_loss, "the job's best loss")
        self.settled('tally_job_quantized_val_loss{tally_job="%s"}' % job.name,
                     lambda v: v == done.quantized_val_loss, "the job's final quantized loss")
        self.settled('tally_job_ends_total{state="budget_exhausted",reason_rule="budget"}',
                     lambda v: v == 1, "one budget end")
        self.settled('tally_job_ends_total{state="succeeded",reason_rule="max_steps"}',
                     lambda v: v == 2, "two max_steps ends")
        # Tokens and FP8 values computed: each fleet counter is the jobs'
        # counters summed.
        for fleet_counter, job_counter in (
                ('tally_tokens_total{kind="useful"}', 'tally_job_tokens_total{kind="useful"}'),
                ("tally_fp8_values_total", "tally_job_fp8_values_total"),
                ("tally_fp8_overflows_total", "tally_job_fp8_overflows_total")):
            self.settled("sum(%s)" % fleet_counter, lambda v: v > 0, fleet_counter)
            self.settled("sum(%s) - sum(%s)" % (fleet_counter, job_counter), lambda v: v == 0,
                         "%s the sum of %s" % (fleet_counter, job_counter))
        self.settled('tally_tokens_total{kind="useful",gpu_type="cpu"}', lambda v: v > 0,
                     "useful tokens on cpu")

        # The forced job: the fraction of its values cast that overflowed is
        # above the alert's threshold (and below the 1% at which the trainer
        # fails a run); the normal FP8 job's is below it. Both alerts fire
        # for the forced job and for no other.
        def fraction(name):
            return ('tally_job_fp8_overflows_total{tally_job="%s"} / '
                    'tally_job_fp8_values_total{tally_job="%s"}' % (name, name))
        self.settled(fraction(forced.name), lambda v: 0.001 < v < 0.01,
                     "the forced job's overflow fraction")
        self.settled(fraction(job.name), lambda v: v < 0.001, "the FP8 job's overflow fraction")
        for name in ("TallyFp8Overflows", "TallyExpertCollapse"):
            wait_for(lambda: self.firing_jobs(name), timeout=20, what=name + " to fire")
            self.assertEqual(self.firing_jobs(name), [forced.name], name)
        self.assertEqual(self.value('tally_job_moe_expert_share{tally_job="%s",layer="0",'
                                    'stat="max"}' % forced.name), 1.0,
                         "every token went to expert 0")
        for name, expected in (("TallyJobFailed", failing.name),
                               ("TallyJobAttemptsLost", failing.name),
                               ("TallyJobDiverged", diverging.name)):
            wait_for(lambda: self.firing_jobs(name), timeout=20, what=name + " to fire")
            self.assertEqual(self.firing_jobs(name), [expected], name)
        # The budget alert still fires for the job that went on to exhaust
        # its budget (a 15 s scrape would see it), not for the other.
        self.assertTrue(self.alerts("TallyJobBudgetAt80Percent", tally_job=job.name))
        self.assertFalse(self.alerts("TallyJobBudgetAt80Percent", tally_job=first.name))

        empty, failed = [], []
        for path in LIVE_DASHBOARDS:
            for title, expr in panel_exprs(path):
                expr = (expr.replace("$job", job.name).replace("$__range", "5m")
                        .replace("$__rate_interval", "1m"))
                reply = self.api("query", query=expr)
                if reply["status"] != "success":
                    failed.append((title, expr, reply))
                elif not reply["data"]["result"]:
                    empty.append((os.path.basename(path), title, expr))
        self.assertEqual(failed, [])
        self.assertEqual(empty, [], "every panel returns data")

        for name in ("TallyWorkerLost", "TallydDown", "TallyLostDollarsHigh", "TallyQueueStuck"):
            self.assertEqual(self.alerts(name), [], name + " must not fire")

        # A worker killed with SIGKILL: its stream is counted with its real
        # code, and the worker-lost alert fires on the counter although the
        # worker has left tally_workers.
        w2 = self.add_worker("w2")
        wait_for(lambda: 'tally_workers{gpu_type="cpu",state="connected"} 2'
                 in self.tallyd.scrape(), timeout=30, what="w2 to connect")
        self.assertEqual(self.alerts("TallyWorkerLost"), [])
        w2.kill()
        wait_for(lambda: self.alerts("TallyWorkerLost", gpu_type="cpu"), timeout=30,
                 what="the worker-lost alert")
        self.assertEqual(self.value('tally_workers_lost_total{gpu_type="cpu"}'), 1)
        connect = ('grpc_server_handled_total{grpc_service="tally.v1.Workers",'
                   'grpc_method="Connect",grpc_type="bidi_stream",grpc_code="%s"}')
        self.assertGreaterEqual(self.value(connect % "Canceled"), 1)
        self.assertEqual(self.value(connect % "OK"), 0, "a broken stream is not OK")
        self.assertEqual(self.value('grpc_server_handled_total{grpc_service="tally.v1.Jobs",'
                                    'grpc_method="CancelJob",grpc_code="NotFound"}'), 0,
                         "created at 0 before the first error")
        self.assertIsNotNone(self.value("tally_build_info"))

        groups = self.api("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        with open(RULES) as f:
            defined = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        self.assertEqual(len(rules), len(defined))
        self.assertEqual(len(rules), 13)
        for r in rules:
            self.assertEqual(r["health"], "ok", r)

        # README's metric tables name exactly the families tallyd exports.
        exported = set(re.findall(r"^# TYPE (\w+) ", self.tallyd.scrape(), re.M))
        self.assertEqual(readme_metrics(), exported)
        self.assertLess(time.monotonic() - started, 150, "the test's wall time stays bounded")


if __name__ == "__main__":
    unittest.main()
