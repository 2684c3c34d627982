"""deploy/k8s renders offline with kustomize (kubectl's, from PyPI) for each
overlay, and every rendered object validates: built-in kinds against the
Kubernetes JSON schemas of a current release (kubernetes-validate, offline,
strict), custom resources against their own schema in deploy/k8s/schemas."""

import json
import os
import subprocess
import tempfile
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.environ.get("TALLY_PYTOOLS", "")
K8S = os.path.join(ROOT, "deploy", "k8s")
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"):
        os.path.join(K8S, "schemas", "servicemonitor.monitoring.coreos.com-v1.json"),
}


def tool(name):
    path = os.path.join(TOOLS, "bin", name)
    if not os.path.exists(path):
        raise AssertionError("%s is missing: scripts/setup.sh installs it into %s" % (name, TOOLS))
    return path


def render(overlay):
    r = subprocess.run([tool("kubectl"), "kustomize", os.path.join(K8S, "overlays", overlay)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def find(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


class DeployTest(unittest.TestCase):

    def validate(self, objects):
        builtin, custom = [], []
        for o in objects:
            (custom if (o["apiVersion"], o["kind"]) in CRD_SCHEMAS else builtin).append(o)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(builtin, f)
        r = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet",
                            "-k", "1.37.0", f.name], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("WARN", r.stdout + r.stderr, "every built-in kind has a schema")
        for o in custom:
            schema = CRD_SCHEMAS[(o["apiVersion"], o["kind"])]
            check = subprocess.run(
                [tool("python"), "-c",
                 "import json,sys,jsonschema; jsonschema.validate(json.load(sys.stdin), "
                 "json.load(open(sys.argv[1])))", schema],
                input=json.dumps(o), capture_output=True, text=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stderr)
        return builtin, custom

    def test_cpu_overlay(self):
        objects = render("cpu")
        builtin, custom = self.validate(objects)
        self.assertEqual([o["kind"] for o in custom], ["ServiceMonitor"])
        for o in objects:
            if o["kind"] != "Namespace":
                self.assertEqual(o["metadata"]["namespace"], "tally", o["metadata"]["name"])
        tallyd = find(objects, "Deployment", "tallyd")
        spec = tallyd["spec"]
        self.assertEqual(spec["replicas"], 1)
        self.assertEqual(spec["strategy"]["type"], "Recreate")
        pod = spec["template"]["spec"]
        c = pod["containers"][0]
        self.assertEqual(c["image"], "tally/tallyd:0.1.0")
        self.assertEqual(c["readinessProbe"]["grpc"]["port"], 50051)
        self.assertEqual(c["livenessProbe"]["grpc"]["port"], 50051)
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertIn("requests", c["resources"])
        self.assertIn("--config=/etc/tally/tallyd.yaml", c["args"])
        self.assertEqual(pod["volumes"][0]["persistentVolumeClaim"]["claimName"], "tallyd-data")
        worker = find(objects, "StatefulSet", "tally-worker")
        self.assertEqual(worker["spec"]["serviceName"], "tally-worker")
        self.assertEqual(find(objects, "Service", "tally-worker")["spec"]["clusterIP"], "None")
        wc = worker["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(wc["image"], "tally/tally-worker:0.1.0-cpu")
        self.assertIn("--device=cpu", wc["args"])
        self.assertEqual(
            find(objects, "PersistentVolumeClaim", "tally-checkpoints")["spec"]["accessModes"],
            ["ReadWriteMany"])
        kinds = {o["kind"] for o in objects}
        self.assertTrue({"PodDisruptionBudget", "NetworkPolicy", "ConfigMap", "Service"} <= kinds)
        # The ConfigMap's prices parse as tallyd's config.
        prices = yaml.safe_load(find(objects, "ConfigMap", "tallyd-config")["data"]["tallyd.yaml"])
        self.assertIn("cpu", prices["usd_per_gpu_hour"])

    def test_gpu_overlay(self):
        objects = render("gpu")
        self.validate(objects)
        worker = find(objects, "StatefulSet", "tally-worker")
        pod = worker["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertIn("--device=cuda:0", c["args"])
        self.assertEqual(c["image"], "tally/tally-worker:0.1.0-cuda13.0")
        self.assertIn({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                      pod["tolerations"])

    def test_base_leaves_tags_and_sizes_to_overlays(self):
        for path in ("tallyd.yaml", "worker.yaml"):
            with open(os.path.join(K8S, "base", path)) as f:
                for o in yaml.safe_load_all(f):
                    if not o or o["kind"] not in ("Deployment", "StatefulSet"):
                        continue
                    for c in o["spec"]["template"]["spec"]["containers"]:
                        self.assertNotIn(":", c["image"], "image tags only in overlays")
                        if o["kind"] == "StatefulSet":
                            self.assertNotIn("resources", c, "worker sizes only in overlays")


if __name__ == "__main__":
    unittest.main()
