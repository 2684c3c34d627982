"""The dashboards and alert rules in deploy/ against a real Prometheus
(Debian's) scraping a real tallyd while real jobs run: every panel's PromQL
returns data, every rule evaluates, and the alert the run should trigger
fires."""

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

from harness import ROOT, ClusterTest, jobs_pb2, spec, spec_pb2, wait_for

DEPLOY = os.path.join(ROOT, "deploy")
DASHBOARDS = sorted(glob.glob(os.path.join(DEPLOY, "grafana", "*.json")))
# Dashboards whose every panel the Prometheus test below sees return data.
# experiment.json needs an experiment running; its panels are checked
# statically (ExperimentDashboardTest).
LIVE_DASHBOARDS = [os.path.join(DEPLOY, "grafana", n) for n in ("fleet.json", "job.json")]
RULES = os.path.join(DEPLOY, "prometheus", "alerts.yaml")


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
                group["rules"].append({"record": "tally:panel_%d" % i, "expr": expr})
            rules["groups"].append(group)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            json.dump(rules, f)  # JSON is YAML
            f.flush()
            r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                               text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

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
            f.write("usd_per_gpu_hour: {cpu: 36}\n")  # $0.01 a second
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()
        self.prom_addr = "127.0.0.1:%d" % free_port()
        prom_config = os.path.join(self.dir, "prometheus.yaml")
        with open(prom_config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [%s]\n"
                    "scrape_configs:\n"
                    "  - job_name: tallyd\n"
                    "    static_configs: [{targets: ['%s']}]\n" % (RULES, self.tallyd.metrics_addr))
        self.prom_log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.prom = subprocess.Popen(
            ["prometheus", "--config.file=" + prom_config,
             "--storage.tsdb.path=" + os.path.join(self.dir, "tsdb"),
             "--web.listen-address=" + self.prom_addr],
            stdout=self.prom_log, stderr=subprocess.STDOUT)
        wait_for(self.prom_ready, timeout=60, what="prometheus to start")

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

    def test_every_panel_returns_data_and_the_budget_alert_fires(self):
        self.add_worker("w1")
        # A finished job first, so the fleet's attempt counters have a series.
        first = self.submit(spec(max_steps=5, name="first"))
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
        s.early_stopping.patience = 1000
        s.budget.max_dollars = 0.3  # 80% after 24 s at $0.01/s, exhausted at 30 s
        job = self.submit(s)
        wait_for(lambda: self.get(job.name).cost.cost_usd >= 0.25, timeout=120,
                 what="83% of the budget")
        self.assertEqual(self.get(job.name).state, jobs_pb2.JOB_STATE_RUNNING)
        wait_for(lambda: self.query('ALERTS{alertname="TallyJobBudgetAt80Percent",'
                                    'alertstate="firing",tally_job="%s"}' % job.name),
                 timeout=20, what="the budget alert to fire")
        empty, failed = [], []
        for path in LIVE_DASHBOARDS:
            for title, expr in panel_exprs(path):
                expr = expr.replace("$job", job.name)
                reply = self.api("query", query=expr)
                if reply["status"] != "success":
                    failed.append((title, expr, reply))
                elif not reply["data"]["result"]:
                    empty.append((os.path.basename(path), title, expr))
        self.assertEqual(failed, [])
        self.assertEqual(empty, [], "every panel returns data")
        groups = self.api("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        self.assertEqual(len(rules), 5)
        for r in rules:
            self.assertEqual(r["health"], "ok", r)
        self.tallyd.jobs.CancelJob(jobs_pb2.CancelJobRequest(name=job.name), timeout=10)


if __name__ == "__main__":
    unittest.main()
