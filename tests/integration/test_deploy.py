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
load."""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.environ.get("TALLY_PYTOOLS", "")
BUILD = os.environ.get("TALLY_BUILD_DIR", os.path.join(ROOT, "build"))
K8S = os.path.join(ROOT, "deploy", "k8s")
DOCKER = os.path.join(ROOT, "deploy", "docker")
# The GPU feature discovery product label each GPU pool must be pinned to.
GPU_PRODUCTS = {"h200": "NVIDIA-H200", "a100": "NVIDIA-A100-SXM4-80GB"}
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"):
        os.path.join(K8S, "schemas", "servicemonitor.monitoring.coreos.com-v1.json"),
}


def tool(name):
    path = os.path.join(TOOLS, "bin", name)
    if not os.path.exists(path):
        raise AssertionError("%s is missing: scripts/setup.sh installs it into %s" % (name, TOOLS))
    return path


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
        self.check_tallyd_pod(pod)
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
        resolved = {k: e["value"] for k, e in env.items() if "value" in e}
        resolved["TALLY_THREADS"] = math.ceil(cpu_cores(c["resources"]["limits"]["cpu"]))
        return {k: resolved[k] for k in ("TALLY_DEVICE", "TALLY_GPU_TYPE", "TALLY_THREADS")}

    def test_gpu_overlay(self):
        objects = render("gpu")
        self.validate(objects)
        prices = yaml.safe_load(find(objects, "ConfigMap", "tallyd-config")["data"]["tallyd.yaml"])
        self.check_tallyd_pod(find(objects, "Deployment", "tallyd")["spec"]["template"]["spec"])
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
