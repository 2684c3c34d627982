#!/usr/bin/env python3
"""Writes what deploy/k8s ships for monitoring from the files it comes from,
so the two cannot drift (tests/integration/test_deploy.py checks them):

  deploy/prometheus/alerts.yaml -> deploy/k8s/base/observability/prometheusrule.yaml
                                   (a PrometheusRule whose spec is the file's groups)
  deploy/grafana/*.json         -> deploy/k8s/base/observability/dashboards/
                                   (configMapGenerator makes the dashboard ConfigMaps)

Run it after editing an alert or a dashboard:  python3 scripts/gen-k8s-monitoring.py
With --check it changes nothing and exits 1 if a written file is out of date."""

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus", "alerts.yaml")
DASHBOARDS = os.path.join(ROOT, "deploy", "grafana")
OUT = os.path.join(ROOT, "deploy", "k8s", "base", "observability")

HEADER = """\
# Generated from deploy/prometheus/alerts.yaml by scripts/gen-k8s-monitoring.py:
# edit that file and run the script. prometheus-operator loads these rules
# (kube-prometheus-stack selects PrometheusRules by the `release` label,
# which components/monitoring sets from the overlay's monitoring settings).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tally-alerts
spec:
"""


def prometheus_rule(rules_text):
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def outputs():
    with open(RULES) as f:
        yield os.path.join(OUT, "prometheusrule.yaml"), prometheus_rule(f.read())
    for path in sorted(glob.glob(os.path.join(DASHBOARDS, "*.json"))):
        with open(path) as f:
            yield os.path.join(OUT, "dashboards", os.path.basename(path)), f.read()


def main(argv):
    check = "--check" in argv[1:]
    stale = []
    for path, text in outputs():
        current = None
        if os.path.exists(path):
            with open(path) as f:
                current = f.read()
        if current == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if check and stale:
        print("out of date (run python3 scripts/gen-k8s-monitoring.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    for path in stale:
        print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
