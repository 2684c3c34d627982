"""deploy/k8s renders offline with kustomize (kubectl's, from PyPI) for each
overlay, and every rendered object validates: built-in kinds against the
Kubernetes JSON schemas of a current release (kubernetes-validate, offline,
strict), custom resources against their own schema in deploy/k8s/schemas.
The rendered manifests have the properties the deploy relies on (read-only
roots with a writable /tmp, threads from the CPU limit, shared memory, one
GPU type per node product, storage a laptop cluster provides, monitoring
settings in one place per overlay); the worker's readiness probe works on a
real socket table; .dockerignore keeps build outputs out of the images'
context; and deploy/docker/stage-runtime.sh stages only what the binaries
load. Security: tallyd serves TLS with user and worker authentication from
read-only Secrets, workers verify it and prove their id (a token per pod, or
with components/cert-manager a CSI certificate per pod), nothing passes
--insecure; and scripts/dev-pki.sh makes files a real tallyd serves with.
Preemption: every worker's grace period outlasts its --preemption_deadline
(the checkpoint on SIGTERM lands before Kubernetes kills it), and
components/spot turns a pool into spot workers with a notice file.
Scale and availability: components/keda sizes every GPU pool from
tally_gpus_wanted between 0 and a maximum (KEDA ScaledObjects, validated
against deploy/k8s/schemas, which also refuse a misspelt field); overlays/ha
runs two tallyd replicas on PostgreSQL (the DSN from a Secret file), ready
only while leading, with a disruption budget; components/postgres-dev adds a
PostgreSQL to try it with. Monitoring: every overlay ships the alert rules of
deploy/prometheus/alerts.yaml as a PrometheusRule (exactly its groups) and
each deploy/grafana dashboard as a ConfigMap for Grafana's sidecar (byte for
byte), and a stale generated copy fails."""

import base64
import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# scripts/setup.sh's virtual environment, where tests/CMakeLists.txt finds it.
TOOLS = os.environ.get("TALLY_PYTOOLS") or os.path.join(
    os.environ.get("TALLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tally"),
    "pytools-1")
BUILD = os.environ.get("TALLY_BUILD_DIR", os.path.join(ROOT, "build"))
K8S = os.path.join(ROOT, "deploy", "k8s")
DEV_PKI = os.path.join(ROOT, "scripts", "dev-pki.sh")
DOCKER = os.path.join(ROOT, "deploy", "docker")
# The GPU feature discovery product label each GPU pool must be pinned to.
GPU_PRODUCTS = {"h200": "NVIDIA-H200", "a100": "NVIDIA-A100-SXM4-80GB"}
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"):
        os.path.join(K8S, "schemas", "servicemonitor.monitoring.coreos.com-v1.json"),
    ("cert-manager.io/v1", "Issuer"):
        os.path.join(K8S, "schemas", "issuer.cert-manager.io-v1.json"),
    ("cert-manager.io/v1", "Certificate"):
        os.path.join(K8S, "schemas", "certificate.cert-manager.io-v1.json"),
    ("keda.sh/v1alpha1", "ScaledObject"):
        os.path.join(K8S, "schemas", "scaledobject.keda.sh-v1alpha1.json"),
    ("monitoring.coreos.com/v1", "PrometheusRule"):
        os.path.join(K8S, "schemas", "prometheusrule.monitoring.coreos.com-v1.json"),
}
# What deploy/k8s ships for monitoring comes from these, through
# scripts/gen-k8s-monitoring.py.
ALERT_RULES = os.path.join(ROOT, "deploy", "prometheus", "alerts.yaml")
GRAFANA = os.path.join(ROOT, "deploy", "grafana")
GEN_MONITORING = os.path.join(ROOT, "scripts", "gen-k8s-monitoring.py")
# Where overlays/ha has tallyd read the PostgreSQL DSN (a Secret's file).
POSTGRES_DSN_FILE = "/var/run/secrets/tally/postgres/dsn"


def tool(name):
    path = os.path.join(TOOLS, "bin", name)
    if not os.path.exists(path):
        raise AssertionError("%s is missing: scripts/setup.sh installs it into %s" % (name, TOOLS))
    return path


def duration_seconds(text):
    """A duration flag's value ("25s", "1m30s", "500ms", "1.5h") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, "not a duration: %r" % text
    return sum(float(n) * units[u] for n, u in parts)


# Time a worker needs after --preemption_deadline to report its exit and
# stop, before Kubernetes' kill at the grace period.
PREEMPTION_EXIT_MARGIN_S = 5

SPOT_POOL = """resources:
  - ../../../../base/pool
nameSuffix: -h200-spot
labels:
  - pairs: {tally/gpu-type: h200}
    includeSelectors: true
    includeTemplates: true
components:
  - ../../../../components/spot
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: StatefulSet
      metadata:
        name: tally-worker
      spec:
        replicas: 4
        template:
          spec:
            nodeSelector:
              nvidia.com/gpu.product: NVIDIA-H200
            containers:
              - name: worker
                env:
                  - name: TALLY_GPU_TYPE
                    value: h200
"""


def with_spot(tmp, cert_manager=False):
    """A copy of deploy/k8s using components/spot as its kustomization.yaml
    says: the gpu overlay gains a spot pool of h200 workers beside its
    on-demand pools, the cpu overlay makes its one pool spot."""
    k8s = with_cert_manager(tmp) if cert_manager else os.path.join(tmp, "k8s")
    if not cert_manager:
        shutil.copytree(K8S, k8s)
    pool = os.path.join(k8s, "overlays", "gpu", "pools", "h200-spot")
    os.mkdir(pool)
    with open(os.path.join(pool, "kustomization.yaml"), "w") as f:
        f.write(SPOT_POOL)
    for overlay, key, entry in (("gpu", "resources", "pools/h200-spot"),
                                ("cpu", "components", "../../components/spot")):
        path = os.path.join(k8s, "overlays", overlay, "kustomization.yaml")
        with open(path) as f:
            doc = yaml.safe_load(f)
        doc[key].append(entry)
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
    return k8s


def with_cert_manager(tmp):
    """A copy of deploy/k8s whose overlays use components/cert-manager, as
    its kustomization.yaml says to."""
    k8s = os.path.join(tmp, "k8s")
    shutil.copytree(K8S, k8s)
    for overlay in ("cpu", "gpu"):
        path = os.path.join(k8s, "overlays", overlay, "kustomization.yaml")
        with open(path) as f:
            doc = yaml.safe_load(f)
        doc["components"].append("../../components/cert-manager")
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
    return k8s


def with_overlay(tmp, name, resources, components):
    """A copy of deploy/k8s with overlays/NAME made of RESOURCES and
    COMPONENTS (paths relative to the new overlay), as a user would make one
    to use an optional component."""
    k8s = os.path.join(tmp, "k8s")
    if not os.path.exists(k8s):
        shutil.copytree(K8S, k8s)
    os.mkdir(os.path.join(k8s, "overlays", name))
    with open(os.path.join(k8s, "overlays", name, "kustomization.yaml"), "w") as f:
        yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                        "resources": resources, "components": components}, f)
    return k8s


def schema_errors(obj, schema):
    """The jsonschema errors of a custom resource against SCHEMA, a file of
    deploy/k8s/schemas (empty: it validates)."""
    r = subprocess.run(
        [tool("python"), "-c",
         "import json,sys,jsonschema\n"
         "v = jsonschema.Draft7Validator(json.load(open(sys.argv[1])))\n"
         "for e in v.iter_errors(json.load(sys.stdin)): print(list(e.path), e.message)", schema],
        input=json.dumps(obj), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def render(overlay, k8s=K8S):
    r = subprocess.run([tool("kubectl"), "kustomize", os.path.join(k8s, "overlays", overlay)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def find(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def cpu_cores(quantity):
    """A Kubernetes CPU quantity ("2", "500m") in cores."""
    q = str(quantity)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def dockerignore_excludes(patterns, path):
    """Whether the build context leaves PATH out, by Docker's .dockerignore
    rules (moby/patternmatcher): patterns are relative to the context root,
    `*` and `?` stay within one path element, `**` spans any number, a `!`
    pattern re-includes, the last matching pattern wins, and a path whose
    parent directory is excluded is excluded."""
    def regex(p):
        out, i = "", 0
        while i < len(p):
            if p.startswith("**", i):
                out += ".*"
                i += 2
                if p.startswith("/", i):
                    out, i = out[:-2] + "(.*/)?", i + 1
            elif p[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif p[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(p[i]), i + 1
        return re.compile(out + "$")
    rules = []
    for line in patterns:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        p = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, regex(p)))
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for negate, rx in rules:
        if any(rx.match(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def flag(container, name):
    """The value of --NAME=VALUE in the container's args, or None."""
    values = [a.split("=", 1)[1] for a in container.get("args", [])
              if a.startswith("--%s=" % name)]
    assert len(values) <= 1, values
    return values[0] if values else None


def mounted(pod, container, path):
    """(the volume, the mount, the path inside the volume) that PATH in the
    container's filesystem reads."""
    best = None
    for m in container.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/") + "/"
        if path.startswith(root) and (best is None or len(root) > len(best[1])):
            best = (m, root)
    assert best, "%s is on no volume" % path
    mount, root = best
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return volume, mount, path[len(root):]


def secret_file(pod, container, path):
    """(Secret name, key) of the read-only Secret file at PATH."""
    volume, mount, rel = mounted(pod, container, path)
    assert "secret" in volume, "%s is not from a Secret: %s" % (path, volume)
    assert mount.get("readOnly") is True, "%s is mounted writable" % path
    assert "subPath" not in mount, "a subPath mount never sees a Secret's updates"
    secret = volume["secret"]
    if "items" in secret:
        keys = {i["path"]: i["key"] for i in secret["items"]}
        assert rel in keys, "%s: no item %s in %s" % (path, rel, secret)
        return secret["secretName"], keys[rel]
    return secret["secretName"], rel


def all_args(objects):
    for o in objects:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for a in c.get("command", []) + c.get("args", []):
                yield o["metadata"]["name"], a


def pod_labels(workload):
    return workload["spec"]["template"]["metadata"]["labels"]


def monitoring_of(objects):
    """(the ServiceMonitor's release label, the namespace allowed to scrape)."""
    release = find(objects, "ServiceMonitor", "tallyd")["metadata"]["labels"]["release"]
    ingress = find(objects, "NetworkPolicy", "tallyd")["spec"]["ingress"]
    namespaces = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                  for rule in ingress for peer in rule.get("from", []) if "namespaceSelector" in peer]
    assert len(namespaces) == 1, namespaces
    return release, namespaces[0]


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
        self.assertEqual(sorted(o["kind"] for o in custom), ["PrometheusRule", "ServiceMonitor"])
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
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.check_tallyd_pod(pod)
        self.check_tallyd_security(pod, worker_tokens=True)
        self.assertIn("--config=/etc/tally/tallyd.yaml", c["args"])
        self.assertEqual(pod["volumes"][0]["persistentVolumeClaim"]["claimName"], "tallyd-data")
        worker = find(objects, "StatefulSet", "tally-worker")
        self.assertEqual(worker["spec"]["serviceName"], "tally-worker")
        self.assertEqual(find(objects, "Service", "tally-worker")["spec"]["clusterIP"], "None")
        wc = worker["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(wc["image"], "tally/tally-worker:0.1.0-cpu")
        self.assertEqual(self.check_worker_pod(worker), {"TALLY_DEVICE": "cpu",
                                                         "TALLY_GPU_TYPE": "cpu",
                                                         "TALLY_THREADS": 2})
        self.check_worker_security(worker, objects, per_pod_certificate=False)
        self.check_no_insecure(objects)
        # A one-node laptop cluster's default storage class: ReadWriteOnce,
        # no class named, and the workers kept on one node to share it.
        for pvc in of_kind(objects, "PersistentVolumeClaim"):
            self.assertEqual(pvc["spec"]["accessModes"], ["ReadWriteOnce"],
                             pvc["metadata"]["name"])
            self.assertNotIn("storageClassName", pvc["spec"], pvc["metadata"]["name"])
        affinity = worker["spec"]["template"]["spec"]["affinity"]["podAffinity"]
        term = affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(term["labelSelector"]["matchLabels"],
                         {"app.kubernetes.io/name": "tally-worker"})
        kinds = {o["kind"] for o in objects}
        self.assertTrue({"PodDisruptionBudget", "NetworkPolicy", "ConfigMap", "Service"} <= kinds)
        # The ConfigMap's prices parse as tallyd's config.
        prices = yaml.safe_load(find(objects, "ConfigMap", "tallyd-config")["data"]["tallyd.yaml"])
        self.assertIn("cpu", prices["usd_per_gpu_hour"])

    def check_tallyd_security(self, pod, worker_tokens, leader_readiness=False):
        """TLS, user tokens and worker authentication, each from a file of a
        read-only Secret; probes that work on a TLS-only gRPC port (with
        leader_readiness, ready is GET /readyz on the metrics port)."""
        c = pod["containers"][0]
        self.assertFalse(flag(c, "listen").startswith("127."), "served beyond the pod")
        self.assertEqual(secret_file(pod, c, flag(c, "tls_cert")), ("tally-tls", "tls.crt"))
        self.assertEqual(secret_file(pod, c, flag(c, "tls_key")), ("tally-tls", "tls.key"))
        self.assertEqual(secret_file(pod, c, flag(c, "client_ca")), ("tally-tls", "ca.crt"))
        self.assertEqual(secret_file(pod, c, flag(c, "auth_tokens")), ("tally-auth", "users.yaml"))
        if worker_tokens:
            self.assertEqual(secret_file(pod, c, flag(c, "worker_tokens")),
                             ("tally-auth", "workers.yaml"))
        else:
            self.assertIsNone(flag(c, "worker_tokens"))
        for v in pod["volumes"]:
            if "secret" in v:
                # Readable by the pod's group (fsGroup) and nobody else.
                self.assertEqual(v["secret"].get("defaultMode"), 0o440, v["name"])
        # Kubernetes' gRPC probe has no TLS: none may probe the gRPC port.
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        grpc_port = int(flag(c, "listen").rsplit(":", 1)[1])
        metrics_port = int(flag(c, "metrics_listen").rsplit(":", 1)[1])
        for kind in ("readinessProbe", "livenessProbe"):
            self.assertNotIn("grpc", c[kind], kind)
        if leader_readiness:
            ready = c["readinessProbe"]["httpGet"]
            self.assertEqual((ready["path"], ports.get(ready["port"], ready["port"])),
                             ("/readyz", metrics_port))
            self.assertNotEqual(ready.get("scheme", "HTTP"), "HTTPS")
        else:
            ready = c["readinessProbe"]["tcpSocket"]["port"]
            self.assertEqual(ports.get(ready, ready), grpc_port)
        live = c["livenessProbe"]["httpGet"]
        self.assertEqual((live["path"], ports.get(live["port"], live["port"])),
                         ("/healthz", metrics_port))
        self.assertNotEqual(live.get("scheme", "HTTP"), "HTTPS")

    def check_worker_security(self, worker, objects, per_pod_certificate):
        """The worker verifies tallyd against the CA of tally-tls (and sees
        nothing else of that Secret), and proves its --worker_id, the pod's
        name: by its own token from tally-worker-token, or by a client
        certificate from cert-manager's CSI driver whose CN is the pod name."""
        pod = worker["spec"]["template"]["spec"]
        c = pod["containers"][0]
        name = worker["metadata"]["name"]
        self.assertEqual(flag(c, "worker_id"), "$(POD_NAME)", name)
        self.assertEqual(env_of(c)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.name")
        self.assertEqual(secret_file(pod, c, flag(c, "ca_cert")), ("tally-tls", "ca.crt"))
        volume, _, _ = mounted(pod, c, flag(c, "ca_cert"))
        self.assertEqual([i["key"] for i in volume["secret"]["items"]], ["ca.crt"],
                         "%s: only the CA of tally-tls, never tallyd's key" % name)
        self.assertEqual(flag(c, "data_root"), c["workingDir"])
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        if not per_pod_certificate:
            self.assertIsNone(flag(c, "tls_cert"), name)
            token = flag(c, "token_file")
            self.assertTrue(token.endswith("/$(POD_NAME)"), token)
            self.assertEqual(secret_file(pod, c, token), ("tally-worker-token", "$(POD_NAME)"))
            return
        self.assertIsNone(flag(c, "token_file"), name)
        self.assertNotIn("tally-worker-token", secrets, name)
        cert, _, cert_file = mounted(pod, c, flag(c, "tls_cert"))
        key, mount, key_file = mounted(pod, c, flag(c, "tls_key"))
        self.assertIs(cert, key)
        self.assertTrue(mount.get("readOnly"), name)
        csi = cert["csi"]
        self.assertEqual(csi["driver"], "csi.cert-manager.io")
        self.assertTrue(csi["readOnly"])
        attrs = csi["volumeAttributes"]
        # The driver's own variable: the pod's name, which is --worker_id.
        self.assertEqual(attrs["csi.cert-manager.io/common-name"], "${POD_NAME}")
        self.assertEqual((cert_file, key_file),
                         (attrs.get("csi.cert-manager.io/certificate-file", "tls.crt"),
                          attrs.get("csi.cert-manager.io/privatekey-file", "tls.key")))
        self.assertIn("client auth", attrs["csi.cert-manager.io/key-usages"].split(","))
        self.assertEqual(attrs["csi.cert-manager.io/fs-group"],
                         str(pod["securityContext"]["runAsGroup"]))
        issuer = find(objects, attrs.get("csi.cert-manager.io/issuer-kind", "Issuer"),
                      attrs["csi.cert-manager.io/issuer-name"])
        self.assertEqual(issuer["metadata"]["namespace"], worker["metadata"]["namespace"])

    def check_no_insecure(self, objects):
        for name, arg in all_args(objects):
            self.assertFalse(arg.startswith("--insecure"), "%s passes %s" % (name, arg))

    def check_tallyd_pod(self, pod):
        """A read-only root with /tmp on an emptyDir; requests and limits."""
        c = pod["containers"][0]
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertIn("/tmp", mounts)
        self.assertIn("emptyDir", volumes[mounts["/tmp"]])
        for kind in ("requests", "limits"):
            self.assertEqual(set(c["resources"][kind]), {"cpu", "memory"}, kind)

    def check_worker_pod(self, worker):
        """The worker's flags come from its env (every $(VAR) defined), its
        threads from its CPU limit, /dev/shm is a memory volume of bounded
        size, and it has a readiness probe. Returns the env as the pod would
        see it, with TALLY_THREADS resolved from the limit."""
        pod = worker["spec"]["template"]["spec"]
        c = pod["containers"][0]
        env = env_of(c)
        for arg in c["args"]:
            for var in re.findall(r"\$\((\w+)\)", arg):
                self.assertIn(var, env, "%s in %s is not defined" % (var, arg))
        self.assertIn("--threads=$(TALLY_THREADS)", c["args"])
        ref = env["TALLY_THREADS"]["valueFrom"]["resourceFieldRef"]
        self.assertEqual((ref["containerName"], ref["resource"], ref["divisor"]),
                         (c["name"], "limits.cpu", "1"))
        self.assertIn("cpu", c["resources"]["limits"], "--threads needs a CPU limit")
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        self.assertEqual(shm["medium"], "Memory")
        self.assertIn("sizeLimit", shm)
        self.assertIn("emptyDir", volumes[mounts["/tmp"]])
        self.assertIn("exec", c["readinessProbe"])
        self.assertNotIn("livenessProbe", c)
        self.check_preemption_grace(worker)
        resolved = {k: e["value"] for k, e in env.items() if "value" in e}
        resolved["TALLY_THREADS"] = math.ceil(cpu_cores(c["resources"]["limits"]["cpu"]))
        return {k: resolved[k] for k in ("TALLY_DEVICE", "TALLY_GPU_TYPE", "TALLY_THREADS")}

    def check_preemption_grace(self, worker):
        """On SIGTERM the worker checkpoints and exits within its
        --preemption_deadline; Kubernetes kills it at the grace period, which
        must come later, with time to report the exit."""
        pod = worker["spec"]["template"]["spec"]
        c = pod["containers"][0]
        name = worker["metadata"]["name"]
        deadline = flag(c, "preemption_deadline")
        self.assertIsNotNone(deadline, "%s: --preemption_deadline set explicitly" % name)
        # Kubernetes' default grace period is 30 s.
        grace = pod.get("terminationGracePeriodSeconds", 30)
        self.assertGreaterEqual(grace - duration_seconds(deadline), PREEMPTION_EXIT_MARGIN_S,
                                "%s: grace %ss, --preemption_deadline=%s" % (name, grace, deadline))

    def check_spot_pool(self, worker, spot):
        """A spot pool announces --capacity=spot, watches a notice file on an
        emptyDir of its own that a sidecar may write, and selects its pods by
        tally/capacity; an on-demand pool does none of that."""
        pod = worker["spec"]["template"]["spec"]
        c = pod["containers"][0]
        name = worker["metadata"]["name"]
        selector = worker["spec"]["selector"]["matchLabels"]
        if not spot:
            self.assertIn(flag(c, "capacity"), (None, "on_demand"), name)
            self.assertIsNone(flag(c, "preemption_notice_file"), name)
            self.assertNotIn("tally/capacity", selector, name)
            return
        self.assertEqual(flag(c, "capacity"), "spot", name)
        self.assertEqual(selector.get("tally/capacity"), "spot", name)
        self.assertLessEqual(selector.items(), pod_labels(worker).items(), name)
        notice = flag(c, "preemption_notice_file")
        self.assertTrue(notice and notice.startswith("/"), name)
        volume, mount, rel = mounted(pod, c, notice)
        self.assertIn("emptyDir", volume, "%s: the notice file's volume is the pod's own" % name)
        self.assertTrue(rel and "/" not in rel, rel)
        self.assertFalse(mount.get("readOnly", False), "%s: a sidecar may create it" % name)
        self.assertNotIn("subPath", mount)
        # Only the notice lives there: no other mount shares the volume.
        self.assertEqual([m["name"] for m in c["volumeMounts"]].count(volume["name"]), 1)
        # The base's arguments keep their indices (components/cert-manager
        # replaces index 9); the component's come after them.
        base = find(render("cpu"), "StatefulSet", "tally-worker")
        base_args = base["spec"]["template"]["spec"]["containers"][0]["args"]
        for i, arg in enumerate(base_args):
            if arg.startswith("--token_file="):
                continue  # replaced with components/cert-manager
            self.assertEqual(c["args"][i], arg, "%s: argument %d moved" % (name, i))

    def test_spot_component(self):
        """components/spot, used as its kustomization.yaml says, renders and
        validates in each overlay, alone and with components/cert-manager."""
        for cert_manager in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                k8s = with_spot(tmp, cert_manager=cert_manager)
                for overlay in ("cpu", "gpu"):
                    where = "%s%s" % (overlay, " with cert-manager" if cert_manager else "")
                    objects = render(overlay, k8s)
                    self.validate(objects)
                    self.check_no_insecure(objects)
                    pools = {p["metadata"]["name"]: p for p in of_kind(objects, "StatefulSet")}
                    expected = ({"tally-worker": True} if overlay == "cpu" else
                                {"tally-worker-h200": False, "tally-worker-a100": False,
                                 "tally-worker-h200-spot": True})
                    self.assertEqual({n: flag(p["spec"]["template"]["spec"]["containers"][0],
                                              "capacity") == "spot"
                                      for n, p in pools.items()}, expected, where)
                    selectors = set()
                    for name, worker in pools.items():
                        self.check_worker_pod(worker)
                        self.check_worker_security(worker, objects,
                                                   per_pod_certificate=cert_manager)
                        self.check_spot_pool(worker, spot=expected[name])
                        selectors.add(tuple(sorted(worker["spec"]["selector"]["matchLabels"]
                                                   .items())))
                    self.assertEqual(len(selectors), len(pools), where)
                    # Every spot pool's GPU type has a spot price.
                    prices = yaml.safe_load(find(objects, "ConfigMap", "tallyd-config")
                                            ["data"]["tallyd.yaml"])
                    for name, worker in pools.items():
                        gpu_type = self.check_worker_pod(worker)["TALLY_GPU_TYPE"]
                        if expected[name]:
                            self.assertGreater(prices["spot_usd_per_gpu_hour"][gpu_type], 0, name)
                            self.assertLess(prices["spot_usd_per_gpu_hour"][gpu_type],
                                            prices["usd_per_gpu_hour"][gpu_type], name)
                    if overlay == "gpu":
                        spot = pools["tally-worker-h200-spot"]
                        self.assertEqual(env_of(spot["spec"]["template"]["spec"]["containers"][0])
                                         ["TALLY_GPU_TYPE"]["value"], "h200")
                        # The overlay's GPU settings reach the spot pool too.
                        self.assertEqual(spot["spec"]["template"]["spec"]["containers"][0]
                                         ["resources"]["limits"]["nvidia.com/gpu"], 1)

    def test_gpu_overlay(self):
        objects = render("gpu")
        self.validate(objects)
        prices = yaml.safe_load(find(objects, "ConfigMap", "tallyd-config")["data"]["tallyd.yaml"])
        self.check_tallyd_pod(find(objects, "Deployment", "tallyd")["spec"]["template"]["spec"])
        self.check_tallyd_security(find(objects, "Deployment", "tallyd")["spec"]["template"]["spec"],
                                   worker_tokens=True)
        self.check_no_insecure(objects)
        pools = of_kind(objects, "StatefulSet")
        self.assertEqual(sorted(p["metadata"]["name"] for p in pools),
                         sorted("tally-worker-" + g for g in GPU_PRODUCTS),
                         "one pool per GPU type, and no CPU pool")
        selectors = set()
        for worker in pools:
            name = worker["metadata"]["name"]
            pod = worker["spec"]["template"]["spec"]
            c = pod["containers"][0]
            env = self.check_worker_pod(worker)
            self.check_worker_security(worker, objects, per_pod_certificate=False)
            gpu_type = env["TALLY_GPU_TYPE"]
            self.assertEqual(name, "tally-worker-" + gpu_type)
            # Pinned to its GPU product, so a worker priced as `gpu_type`
            # runs only on that GPU.
            self.assertEqual(pod["nodeSelector"], {"nvidia.com/gpu.product": GPU_PRODUCTS[gpu_type]},
                             name)
            self.assertIn(gpu_type, prices["usd_per_gpu_hour"], name)
            self.assertIn(gpu_type, prices["flops_per_second_per_gpu"], name)
            labels = worker["spec"]["selector"]["matchLabels"]
            self.assertEqual(labels["tally/gpu-type"], gpu_type)
            self.assertLessEqual(labels.items(), pod_labels(worker).items())
            selectors.add(tuple(sorted(labels.items())))
            self.assertEqual(worker["spec"]["serviceName"], "tally-worker")
            self.assertEqual(env["TALLY_DEVICE"], "cuda:0")
            self.assertEqual(env["TALLY_THREADS"], 8)
            self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1)
            self.assertEqual(c["image"], "tally/tally-worker:0.1.0-cuda13.0")
            self.assertIn({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                          pod["tolerations"])
        self.assertEqual(len(selectors), len(pools), "pools must not select each other's pods")
        # Shared checkpoints across nodes: ReadWriteMany, and the overlay says so.
        self.assertEqual(
            find(objects, "PersistentVolumeClaim", "tally-checkpoints")["spec"]["accessModes"],
            ["ReadWriteMany"])
        with open(os.path.join(K8S, "overlays", "gpu", "kustomization.yaml")) as f:
            self.assertIn("ReadWriteMany", f.read())

    def test_keda_component_scales_each_gpu_pool_from_zero(self):
        """components/keda on top of the gpu overlay: one ScaledObject per
        pool, on its StatefulSet, from 0 to a maximum, asking Prometheus for
        the pool's GPU type's tally_gpus_wanted with a threshold of one
        worker's GPUs; the pools leave their replicas to KEDA."""
        with tempfile.TemporaryDirectory() as tmp:
            k8s = with_overlay(tmp, "gpu-autoscaled", ["../gpu"], ["../../components/keda"])
            objects = render("gpu-autoscaled", k8s)
        _, custom = self.validate(objects)
        self.assertEqual(sorted(o["kind"] for o in custom),
                         ["PrometheusRule", "ScaledObject", "ScaledObject", "ServiceMonitor"])
        _, prometheus_namespace = monitoring_of(objects)
        pools = {p["metadata"]["name"]: p for p in of_kind(objects, "StatefulSet")}
        scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in of_kind(objects, "ScaledObject")}
        self.assertEqual(sorted(scaled), sorted(pools), "one ScaledObject per pool")
        for name, so in scaled.items():
            worker = pools[name]
            self.assertEqual(so["metadata"]["namespace"], worker["metadata"]["namespace"])
            ref = so["spec"]["scaleTargetRef"]
            self.assertEqual((ref["apiVersion"], ref["kind"]), ("apps/v1", "StatefulSet"))
            self.assertEqual(so["spec"]["minReplicaCount"], 0, name)
            self.assertGreaterEqual(so["spec"]["maxReplicaCount"], 1, name)
            self.assertNotIn("replicas", worker["spec"], "%s: KEDA sets its replicas" % name)
            self.assertGreater(so["spec"]["cooldownPeriod"], 0)
            [trigger] = so["spec"]["triggers"]
            self.assertEqual(trigger["type"], "prometheus")
            meta = trigger["metadata"]
            gpu_type = self.check_worker_pod(worker)["TALLY_GPU_TYPE"]
            self.assertEqual(meta["query"], 'sum(tally_gpus_wanted{gpu_type="%s"})' % gpu_type)
            c = worker["spec"]["template"]["spec"]["containers"][0]
            gpus_per_worker = c["resources"]["limits"]["nvidia.com/gpu"] * int(
                flag(c, "slots") or 1)
            self.assertEqual(float(meta["threshold"]), gpus_per_worker, name)
            # A lost series is an error (KEDA keeps the size), not zero demand.
            self.assertEqual(meta["ignoreNullValues"], "false")
            # The Prometheus whose namespace may scrape tallyd.
            self.assertRegex(meta["serverAddress"],
                             r"^http://[a-z0-9-]+\.%s\.svc(\.cluster\.local)?:9090$"
                             % re.escape(prometheus_namespace))
            # Scaling down preempts a worker's job: slowly, one at a time.
            down = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
            self.assertGreaterEqual(down["stabilizationWindowSeconds"], 60)
            self.assertEqual([(p["type"], p["value"]) for p in down["policies"]], [("Pods", 1)])

    def test_scaledobject_schema_refuses_what_keda_would(self):
        """The ScaledObject schema is not a rubber stamp: a misspelt or
        unknown field, a missing required one, or a threshold KEDA cannot
        read each fail."""
        with open(os.path.join(K8S, "components", "keda", "scaledobjects.yaml")) as f:
            good = next(o for o in yaml.safe_load_all(f) if o)
        schema = CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")]
        self.assertEqual(schema_errors(good, schema), "")
        def broken(change):
            o = json.loads(json.dumps(good))
            change(o)
            return schema_errors(o, schema)
        self.assertIn("minReplicas", broken(lambda o: o["spec"].update(minReplicas=0)))
        self.assertIn("'name' is a required property",
                      broken(lambda o: o["spec"]["scaleTargetRef"].pop("name")))
        self.assertIn("'triggers' is a required property",
                      broken(lambda o: o["spec"].pop("triggers")))
        self.assertIn("threshold", broken(
            lambda o: o["spec"]["triggers"][0]["metadata"].update(threshold=1)))
        self.assertIn("serverAdress", broken(
            lambda o: o["spec"]["triggers"][0]["metadata"].update(serverAdress="http://p:9090")))
        self.assertIn("'query' is a required property",
                      broken(lambda o: o["spec"]["triggers"][0]["metadata"].pop("query")))
        self.assertIn("maxReplicaCount", broken(lambda o: o["spec"].update(maxReplicaCount="8")))
        self.assertIn("keda.sh/v1alpha1", broken(lambda o: o.update(apiVersion="keda.sh/v1")))

    def test_ha_overlay_runs_two_tallyds_on_postgres(self):
        """overlays/ha: two tallyd replicas on PostgreSQL (the DSN from the
        Secret tally-postgres, key dsn, as a file), a lease of 10s, the pod's
        address advertised, ready only while leading (/readyz), alive on
        /healthz, no data volume, a disruption budget; and rollouts that do
        not wait for a standby to become ready."""
        objects = render("ha")
        self.validate(objects)
        self.check_no_insecure(objects)
        tallyd = find(objects, "Deployment", "tallyd")
        spec = tallyd["spec"]
        self.assertEqual(spec["replicas"], 2)
        self.assertEqual(spec["strategy"]["type"], "RollingUpdate")
        self.assertEqual(spec["strategy"]["rollingUpdate"]["maxUnavailable"], "100%")
        pod = spec["template"]["spec"]
        c = pod["containers"][0]
        self.check_tallyd_pod(pod)
        self.check_tallyd_security(pod, worker_tokens=True, leader_readiness=True)
        self.assertEqual(flag(c, "store"), "postgres")
        self.assertEqual(flag(c, "postgres_dsn_file"), POSTGRES_DSN_FILE)
        self.assertEqual(secret_file(pod, c, POSTGRES_DSN_FILE), ("tally-postgres", "dsn"))
        self.assertIsNone(flag(c, "postgres_dsn"), "never a DSN (a password) in the args")
        self.assertEqual(duration_seconds(flag(c, "lease_timeout")), 10)
        self.assertEqual(flag(c, "advertise_address"), "$(POD_IP):50051")
        self.assertEqual(env_of(c)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertIsNone(flag(c, "data_dir"))
        self.assertNotIn("/var/lib/tally", [m["mountPath"] for m in c["volumeMounts"]])
        self.assertFalse([v for v in pod["volumes"] if "persistentVolumeClaim" in v])
        self.assertFalse([o for o in of_kind(objects, "PersistentVolumeClaim")
                          if o["metadata"]["name"] == "tallyd-data"])
        pdb = find(objects, "PodDisruptionBudget", "tallyd")
        self.assertEqual(pdb["spec"]["minAvailable"], 1)
        self.assertEqual(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow")
        self.assertLessEqual(pdb["spec"]["selector"]["matchLabels"].items(),
                             pod_labels(tallyd).items())
        self.assertEqual(pdb["metadata"]["namespace"], "tally")
        # The workers are the gpu overlay's, still reaching tallyd's Service.
        self.assertEqual(sorted(p["metadata"]["name"] for p in of_kind(objects, "StatefulSet")),
                         sorted("tally-worker-" + g for g in GPU_PRODUCTS))
        for worker in of_kind(objects, "StatefulSet"):
            self.assertEqual(flag(worker["spec"]["template"]["spec"]["containers"][0],
                                  "controller"), "tallyd:50051")

    def test_postgres_dev_component_gives_ha_a_database_to_try(self):
        """components/postgres-dev with overlays/ha (and components/keda):
        PostgreSQL 15 behind the Service the DSN names, the Secret tallyd
        reads, reachable from tallyd alone; everything validates."""
        with tempfile.TemporaryDirectory() as tmp:
            k8s = with_overlay(tmp, "ha-dev", ["../ha"],
                               ["../../components/postgres-dev", "../../components/keda"])
            objects = render("ha-dev", k8s)
        self.validate(objects)
        for o in objects:
            if o["kind"] != "Namespace":
                self.assertEqual(o["metadata"]["namespace"], "tally", o["metadata"]["name"])
        secret = find(objects, "Secret", "tally-postgres")
        dsn = base64.b64decode(secret["data"]["dsn"]).decode()
        fields = dict(kv.split("=", 1) for kv in dsn.split())
        service = find(objects, "Service", "tally-postgres")
        self.assertEqual(fields["host"], service["metadata"]["name"])
        self.assertEqual(int(fields["port"]), service["spec"]["ports"][0]["port"])
        db = find(objects, "StatefulSet", "tally-postgres")
        c = db["spec"]["template"]["spec"]["containers"][0]
        self.assertRegex(c["image"], r"^postgres:15(\.\d+)?$")
        env = env_of(c)
        self.assertEqual(env["POSTGRES_DB"]["value"], fields["dbname"])
        self.assertEqual(env["POSTGRES_USER"]["value"], fields["user"])
        ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
        self.assertEqual(base64.b64decode(secret["data"][ref["key"]]).decode(), fields["password"])
        self.assertLessEqual(service["spec"]["selector"].items(), pod_labels(db).items())
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        policy = find(objects, "NetworkPolicy", "tally-postgres")
        self.assertEqual(policy["spec"]["ingress"][0]["from"],
                         [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tallyd"}}}])
        tallyd = find(objects, "Deployment", "tallyd")["spec"]["template"]["spec"]
        self.assertEqual(secret_file(tallyd, tallyd["containers"][0], POSTGRES_DSN_FILE),
                         ("tally-postgres", "dsn"))

    def test_monitoring_settings_in_one_place_per_overlay(self):
        for overlay in ("cpu", "gpu"):
            with open(os.path.join(K8S, "overlays", overlay, "monitoring-settings.yaml")) as f:
                settings = yaml.safe_load(f)["data"]
            self.assertEqual(settings["release"], "kube-prometheus-stack", overlay)
            self.assertEqual(monitoring_of(render(overlay)), (settings["release"],
                                                             settings["namespace"]), overlay)
            # Changing the one file changes every use, and it is not deployed.
            with tempfile.TemporaryDirectory() as tmp:
                k8s = os.path.join(tmp, "k8s")
                shutil.copytree(K8S, k8s)
                path = os.path.join(k8s, "overlays", overlay, "monitoring-settings.yaml")
                with open(path) as f:
                    doc = yaml.safe_load(f)
                doc["data"] = {"release": "prom-" + overlay, "namespace": "observability"}
                with open(path, "w") as f:
                    yaml.safe_dump(doc, f)
                objects = render(overlay, k8s)
                self.assertEqual(monitoring_of(objects), ("prom-" + overlay, "observability"))
                self.assertFalse([o for o in of_kind(objects, "ConfigMap")
                                  if o["metadata"]["name"] == "tally-monitoring-settings"])

    def test_cert_manager_component(self):
        """Each overlay with components/cert-manager renders and validates:
        cert-manager issues tally-tls for the name workers dial, and every
        worker pod gets its own certificate from the CSI driver; no worker
        token is left anywhere."""
        with tempfile.TemporaryDirectory() as tmp:
            k8s = with_cert_manager(tmp)
            for overlay in ("cpu", "gpu"):
                objects = render(overlay, k8s)
                _, custom = self.validate(objects)
                self.assertEqual(sorted(o["kind"] for o in custom),
                                 ["Certificate", "Certificate", "Issuer", "Issuer",
                                  "PrometheusRule", "ServiceMonitor"], overlay)
                for o in objects:
                    if o["kind"] != "Namespace":
                        self.assertEqual(o["metadata"]["namespace"], "tally",
                                         "%s %s" % (overlay, o["metadata"]["name"]))
                pod = find(objects, "Deployment", "tallyd")["spec"]["template"]["spec"]
                self.check_tallyd_pod(pod)
                self.check_tallyd_security(pod, worker_tokens=False)
                self.check_no_insecure(objects)
                pools = of_kind(objects, "StatefulSet")
                self.assertTrue(pools, overlay)
                for worker in pools:
                    self.check_worker_pod(worker)
                    self.check_worker_security(worker, objects, per_pod_certificate=True)
                self.assertNotIn("tally-worker-token", json.dumps(objects))
                # tallyd's certificate: in tally-tls, for the host workers dial,
                # from the CA Issuer the workers' certificates come from, whose
                # CA is a Certificate of its own.
                served = [o for o in of_kind(objects, "Certificate")
                          if o["spec"]["secretName"] == "tally-tls"]
                self.assertEqual(len(served), 1, overlay)
                cert = served[0]["spec"]
                host = flag(pools[0]["spec"]["template"]["spec"]["containers"][0],
                            "controller").rsplit(":", 1)[0]
                self.assertIn(host, cert["dnsNames"])
                self.assertIn("server auth", cert["usages"])
                ca_issuer = find(objects, "Issuer", cert["issuerRef"]["name"])
                csi = pools[0]["spec"]["template"]["spec"]["volumes"]
                csi = next(v["csi"] for v in csi if "csi" in v)
                self.assertEqual(csi["volumeAttributes"]["csi.cert-manager.io/issuer-name"],
                                 ca_issuer["metadata"]["name"])
                ca = next(o for o in of_kind(objects, "Certificate")
                          if o["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"])
                self.assertTrue(ca["spec"]["isCA"])
                self.assertIn("selfSigned", find(objects, "Issuer",
                                                 ca["spec"]["issuerRef"]["name"])["spec"])
                # The NetworkPolicy stays as it is without the component.
                self.assertEqual([o for o in objects if o["kind"] == "NetworkPolicy"],
                                 [o for o in render(overlay) if o["kind"] == "NetworkPolicy"])

    def test_dev_pki_serves_a_real_tallyd(self):
        """scripts/dev-pki.sh's files, given to a real tallyd: the handshake
        verifies against its CA, the user and admin tokens are accepted,
        a call without a token is UNAUTHENTICATED, and a worker's client
        certificate is accepted in the handshake. A second run changes
        nothing; keys and tokens are 0600."""
        tallyd = os.path.join(BUILD, "server", "tallyd")
        if not os.path.exists(tallyd):
            self.skipTest("tallyd not built in %s" % BUILD)
        import grpc  # Debian's python3-grpcio, as harness.py uses.
        with tempfile.TemporaryDirectory() as tmp:
            pki = os.path.join(tmp, "pki")
            env = dict(os.environ, DEV_PKI_SANS="tallyd, DNS:tallyd.tally.svc,10.1.2.3")
            r = subprocess.run([DEV_PKI, pki, "w-0", "w-1"], env=env, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            files = {}
            for d, _, names in os.walk(pki):
                for n in names:
                    with open(os.path.join(d, n), "rb") as f:
                        files[os.path.relpath(os.path.join(d, n), pki)] = f.read()
            tokens = {n: files[n].decode().strip() for n in
                      ("admin.token", "user.token", "worker-tokens/w-0", "worker-tokens/w-1")}
            for name, text in list(files.items()):
                if name.endswith(".key") or name in tokens:
                    mode = os.stat(os.path.join(pki, name)).st_mode & 0o777
                    self.assertEqual(mode, 0o600, name)
                    if name in tokens:
                        self.assertRegex(tokens[name], r"^[0-9a-f]{64}$", name)
                    self.assertNotIn(text.decode().strip(), r.stdout, "%s printed" % name)
            self.assertEqual(len(set(tokens.values())), len(tokens))
            # Again: nothing changes.
            r2 = subprocess.run([DEV_PKI, pki, "w-0", "w-1"], env=env, capture_output=True,
                                text=True, timeout=60)
            self.assertEqual(r2.returncode, 0, r2.stderr)
            self.assertIn("made: nothing", r2.stdout)
            for name, text in files.items():
                with open(os.path.join(pki, name), "rb") as f:
                    self.assertEqual(f.read(), text, name)

            def openssl(*args):
                out = subprocess.run(["openssl"] + list(args), capture_output=True, text=True,
                                     timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                return out.stdout
            ca = os.path.join(pki, "ca.crt")
            server = openssl("x509", "-in", os.path.join(pki, "tallyd.crt"), "-noout",
                             "-ext", "subjectAltName")
            for san in ("IP Address:127.0.0.1", "DNS:localhost", "DNS:tallyd",
                        "DNS:tallyd.tally.svc", "IP Address:10.1.2.3"):
                self.assertIn(san, server)
            worker = openssl("x509", "-in", os.path.join(pki, "workers", "w-1.crt"), "-noout",
                             "-subject", "-ext", "subjectAltName,extendedKeyUsage")
            self.assertIn("CN = w-1", worker)
            self.assertIn("DNS:w-1", worker)
            self.assertIn("TLS Web Client Authentication", worker)
            self.assertIn("prime256v1", openssl("pkey", "-in", os.path.join(pki, "ca.key"),
                                                "-noout", "-text"))
            ca_text = openssl("x509", "-in", ca, "-noout", "-text")
            self.assertIn("CA:TRUE", ca_text)
            def valid_for(hours):
                return subprocess.run(["openssl", "x509", "-in", ca, "-noout", "-checkend",
                                       str(hours * 3600)], capture_output=True).returncode == 0
            self.assertTrue(valid_for(47) and not valid_for(49), "the CA lasts 2 days")
            users = yaml.safe_load(files["users.yaml"])["principals"]
            self.assertEqual(sorted((u["name"], u["tenant"], u["role"]) for u in users),
                             [("admin", "", "admin"), ("dev", "demo", "user")])
            workers = yaml.safe_load(files["workers.yaml"])["principals"]
            self.assertEqual(sorted((w["name"], w["role"]) for w in workers),
                             [("w-0", "worker"), ("w-1", "worker")])

            data = os.path.join(tmp, "data")
            os.mkdir(data)
            addr_file = os.path.join(data, "addr")
            log = open(os.path.join(tmp, "tallyd.log"), "w")
            self.addCleanup(log.close)
            proc = subprocess.Popen(
                [tallyd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                 "--data_dir=" + data, "--address_file=" + addr_file,
                 "--tls_cert=" + os.path.join(pki, "tallyd.crt"),
                 "--tls_key=" + os.path.join(pki, "tallyd.key"), "--client_ca=" + ca,
                 "--auth_tokens=" + os.path.join(pki, "users.yaml"),
                 "--worker_tokens=" + os.path.join(pki, "workers.yaml")],
                stdout=log, stderr=subprocess.STDOUT)

            def stop():
                proc.terminate()
                proc.wait(timeout=30)
            self.addCleanup(stop)
            for _ in range(600):
                if os.path.exists(addr_file) or proc.poll() is not None:
                    break
                time.sleep(0.05)
            with open(os.path.join(tmp, "tallyd.log")) as f:
                self.assertTrue(os.path.exists(addr_file), f.read())
            with open(addr_file) as f:
                grpc_addr = dict(kv.split("=", 1) for kv in f.read().split())["grpc"]

            # The handshake verifies against the CA, with and without a
            # worker's client certificate.
            for extra in ([], ["-cert", os.path.join(pki, "workers", "w-0.crt"),
                               "-key", os.path.join(pki, "workers", "w-0.key")]):
                out = subprocess.run(["openssl", "s_client", "-connect", grpc_addr,
                                      "-CAfile", ca, "-verify_return_error",
                                      "-verify_hostname", "localhost", "-alpn", "h2"] + extra,
                                     input=b"", capture_output=True, timeout=30)
                # What tallyd sends after the handshake (HTTP/2 frames) is binary.
                text = (out.stdout + out.stderr).decode(errors="replace")
                self.assertEqual(out.returncode, 0, text)
                self.assertIn("Verify return code: 0 (ok)", text)

            def list_jobs(token):
                with open(ca, "rb") as f:
                    creds = grpc.ssl_channel_credentials(root_certificates=f.read())
                if token:
                    creds = grpc.composite_channel_credentials(
                        creds, grpc.access_token_call_credentials(token))
                channel = grpc.secure_channel(grpc_addr, creds)
                try:
                    # ListJobs with an empty request: no stubs needed.
                    call = channel.unary_unary("/tally.v1.Jobs/ListJobs",
                                               request_serializer=lambda b: b,
                                               response_deserializer=lambda b: b)
                    return call(b"", timeout=10)
                finally:
                    channel.close()
            list_jobs(tokens["user.token"])
            list_jobs(tokens["admin.token"])
            # No token, an unknown one: UNAUTHENTICATED; a worker's token
            # is known but may not call the Jobs API.
            for token, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                                ("0" * 64, grpc.StatusCode.UNAUTHENTICATED),
                                (tokens["worker-tokens/w-0"], grpc.StatusCode.PERMISSION_DENIED)):
                with self.assertRaises(grpc.RpcError) as err:
                    list_jobs(token)
                self.assertEqual(err.exception.code(), code, err.exception.details())

    def test_worker_readiness_probe_sees_the_connection_to_tallyd(self):
        worker = find(render("cpu"), "StatefulSet", "tally-worker")
        c = worker["spec"]["template"]["spec"]["containers"][0]
        command = c["readinessProbe"]["exec"]["command"]
        controller = next(a for a in c["args"] if a.startswith("--controller="))
        port = int(controller.rsplit(":", 1)[1])
        probe_port = ":%04X" % port
        self.assertIn(probe_port, command[-1], "the probe watches the --controller port")
        if not os.path.exists("/proc/net/tcp"):
            self.skipTest("no /proc/net/tcp here")
        # The same probe against a port of our own: not ready without an
        # established connection, ready with one, not ready once it closes.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        ours = command[:-1] + [command[-1].replace(probe_port, ":%04X" % listener.getsockname()[1])]
        def ready():
            return subprocess.run(ours, timeout=10).returncode == 0
        try:
            self.assertFalse(ready())
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            self.assertTrue(ready())
            client.close()
            server.close()
            self.assertFalse(ready())
        finally:
            listener.close()

    def test_monitoring_ships_the_alert_rules_and_dashboards_of_deploy(self):
        # The generated copies are up to date...
        r = subprocess.run(["python3", GEN_MONITORING, "--check"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(ALERT_RULES) as f:
            rules = yaml.safe_load(f)
        dashboards = {}
        for name in ("fleet", "job", "experiment"):
            with open(os.path.join(GRAFANA, name + ".json")) as f:
                dashboards[name] = f.read()
        for overlay in ("cpu", "gpu", "ha"):
            objects = render(overlay)
            # ...and every overlay renders them: the PrometheusRule holds
            # exactly the rules file's groups, selected like the ServiceMonitor.
            rule = find(objects, "PrometheusRule", "tally-alerts")
            self.assertEqual(rule["spec"], rules, overlay)
            self.assertEqual(rule["metadata"]["labels"]["release"],
                             find(objects, "ServiceMonitor", "tallyd")["metadata"]["labels"]
                             ["release"], overlay)
            self.assertEqual(schema_errors(rule, CRD_SCHEMAS[("monitoring.coreos.com/v1",
                                                              "PrometheusRule")]), "")
            # One ConfigMap per dashboard, byte for byte, for Grafana's sidecar.
            for name, text in dashboards.items():
                cm = find(objects, "ConfigMap", "tally-dashboard-" + name)
                self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
                self.assertEqual(cm["data"], {name + ".json": text}, (overlay, name))
                self.assertEqual(cm["metadata"]["namespace"], "tally")
        # The rendered rules are rules Prometheus loads.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(rule["spec"], f)
            f.flush()
            r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                               text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # A rule edited in deploy/prometheus and not regenerated is caught.
        with tempfile.TemporaryDirectory() as tmp:
            for sub in ("scripts", os.path.join("deploy", "prometheus"),
                        os.path.join("deploy", "grafana")):
                shutil.copytree(os.path.join(ROOT, sub), os.path.join(tmp, sub))
            shutil.copytree(K8S, os.path.join(tmp, "deploy", "k8s"))
            with open(os.path.join(tmp, "deploy", "prometheus", "alerts.yaml"), "a") as f:
                f.write("      - alert: Extra\n        expr: vector(1)\n")
            r = subprocess.run(["python3", os.path.join(tmp, "scripts", "gen-k8s-monitoring.py"),
                                "--check"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("prometheusrule.yaml", r.stderr)

    def test_dockerignore_keeps_build_outputs_out(self):
        with open(os.path.join(ROOT, ".dockerignore")) as f:
            patterns = f.read().splitlines()
        for path in ("build/server/tallyd", "build/CMakeCache.txt", "build-dep/worker/tally-worker",
                     "build-gpu/bench/packing_bench", "build-fuzz/x",
                     "tests/integration/__pycache__/harness.cpython-311.pyc", "server/x.pyc",
                     ".cache/tally/pytools-1/bin/kubectl", "tests/gpu/.debs/libx.deb",
                     "tally-data/tally.db", "tally-checkpoints/1/step-10.pt", ".git/HEAD"):
            self.assertTrue(dockerignore_excludes(patterns, path), path)
        # Everything the images build from stays in.
        r = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True)
        sources = r.stdout.split() if r.returncode == 0 else []
        sources += ["deploy/docker/stage-runtime.sh", "examples/tallyd.yaml", "scripts/setup.sh",
                    "CMakeLists.txt", "server/main.cc", "deploy/build-notes/x"]
        for path in sources:
            self.assertFalse(dockerignore_excludes(patterns, path), path)

    def test_tallyd_image_serves_securely_by_default(self):
        with open(os.path.join(DOCKER, "tallyd.Dockerfile")) as f:
            dockerfile = f.read()
        cmd = re.search(r"^CMD (\[.*?\])$", dockerfile, re.M | re.S).group(1)
        args = json.loads(cmd.replace("\\\n", ""))
        for name in ("tls_cert", "tls_key", "client_ca", "auth_tokens"):
            self.assertTrue(any(a.startswith("--%s=/" % name) for a in args), name)
        self.assertFalse([a for a in args if a.startswith("--insecure")])

    def test_worker_images_copy_only_staged_files(self):
        with open(os.path.join(DOCKER, "worker.Dockerfile")) as f:
            dockerfile = f.read()
        stages = {}
        for m in re.finditer(r"^FROM (\S+) AS (\S+)\n(.*?)(?=^FROM |\Z)", dockerfile, re.M | re.S):
            stages[m.group(2)] = (m.group(1), m.group(3))
        self.assertEqual(set(stages), {"build-cpu", "cpu", "build-cuda", "cuda"})
        # The CUDA build runs on NVIDIA's devel image (nvcc), chosen by an ARG.
        base = stages["build-cuda"][0]
        arg = re.fullmatch(r"\$\{(\w+)\}", base)
        self.assertTrue(arg, base)
        default = re.search(r"^ARG %s=(\S+)" % arg.group(1), dockerfile, re.M).group(1)
        self.assertRegex(default, r"^nvidia/cuda:[\d.]+-(cudnn-)?devel-")
        self.assertEqual(stages["build-cpu"][0], "debian:12")
        for final, build in (("cpu", "build-cpu"), ("cuda", "build-cuda")):
            copies = re.findall(r"^COPY --from=(\S+) (.+?) (\S+)$", stages[final][1], re.M)
            self.assertTrue(copies, final)
            for source_stage, sources, _ in copies:
                self.assertEqual(source_stage, build)
                for source in sources.split():
                    self.assertTrue(source.startswith("/stage/"), "%s copies %s" % (final, source))
            self.assertIn("stage-runtime.sh /stage", stages[build][1])

    def test_stage_runtime_leaves_cuda_and_tools_behind(self):
        bins = [os.path.join(BUILD, p) for p in ("worker/tally-worker", "worker/tally-train",
                                                  "cli/tally-prep")]
        if not all(os.path.exists(b) for b in bins):
            self.skipTest("worker binaries not built in %s" % BUILD)
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([os.path.join(DOCKER, "stage-runtime.sh"), "--dry-run", out] + bins,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, "files.txt")) as f:
                files = [line.split("\t")[1] for line in f.read().splitlines()[:-1]]
            with open(os.path.join(out, "packages.txt")) as f:
                packages = f.read().split()
        names = [os.path.basename(p) for p in files]
        self.assertIn("libtorch_cpu.so", names)
        self.assertIn("libc10.so", names)
        for name in names:
            self.assertNotRegex(name, r"torch_cuda|c10_cuda|nccl|cudnn|cublas", name)
        for path in files:
            self.assertNotIn("pytools", path)
            self.assertNotIn("/include/", path)
        self.assertIn("libgrpc++1.51", packages)


    def test_base_leaves_tags_and_sizes_to_overlays(self):
        seen = set()
        for path in ("tallyd.yaml", "worker.yaml", "pool/statefulset.yaml"):
            with open(os.path.join(K8S, "base", path)) as f:
                for o in yaml.safe_load_all(f):
                    if not o or o["kind"] not in ("Deployment", "StatefulSet"):
                        continue
                    seen.add(o["kind"])
                    for c in o["spec"]["template"]["spec"]["containers"]:
                        self.assertNotIn(":", c["image"], "image tags only in overlays")
                        self.assertNotIn("resources", c, "sizes only in overlays")
        self.assertEqual(seen, {"Deployment", "StatefulSet"})


if __name__ == "__main__":
    unittest.main()
