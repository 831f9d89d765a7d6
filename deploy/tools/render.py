#!/usr/bin/env python3
"""Renders and checks lmperf's deploy files without a cluster, a helm binary or Docker.

Run it with the peers' Python (tests/peers/install.sh installs the pinned packages):

  .venv-peers/bin/python deploy/tools/render.py render [-f VALUES]... [--json] [--validate]
  .venv-peers/bin/python deploy/tools/render.py write-k8s      # regenerates deploy/k8s/lmperf.yaml
  .venv-peers/bin/python deploy/tools/render.py lint [-f VALUES]...  # helm lint, as JSON
  .venv-peers/bin/python deploy/tools/render.py rules [-f VALUES]... # the alerting rules file
  .venv-peers/bin/python deploy/tools/render.py write-alerts   # regenerates deploy/alerts/lmperf.rules.yaml
  .venv-peers/bin/python deploy/tools/render.py yaml2json FILE...

`render` renders deploy/helm/lmperf with Helm's own template engine: helm-python-sdk binds
Helm v4's Go SDK (the code behind `helm template`) through ctypes. Values files merge over the
chart's values.yaml as with `helm template -f`. Release name `lmperf`, namespace `lmperf`.

`--validate` checks every rendered manifest against the Kubernetes OpenAPI JSON schemas bundled
in kubernetes-validate (strict: unknown fields are errors), for the oldest Kubernetes the chart
supports and the newest the package ships. The ServiceMonitor CRD has no schema there; it is
checked against deploy/tools/schemas/servicemonitor-v1.json, a strict hand-written subset of the
Prometheus Operator's CRD that covers the fields the chart uses.
"""

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "lmperf"
K8S_OUT = ROOT / "deploy" / "k8s" / "lmperf.yaml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
RELEASE, NAMESPACE = "lmperf", "lmperf"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.25.0", "1.37.0"]
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
}
ALERTS_OUT = ROOT / "deploy" / "alerts" / "lmperf.rules.yaml"


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def render(values_files):
    """[(source template, manifest dict)] in template path order, empty documents skipped."""
    import helm_python as helm

    values = {}
    for f in values_files:
        values = deep_merge(values, yaml.safe_load(Path(f).read_text()) or {})
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    out = []
    for source in sorted(files):
        if not source.endswith((".yaml", ".yml")):
            continue  # NOTES.txt and the like
        for doc in yaml.safe_load_all(files[source]):
            if doc:
                out.append((source, doc))
    return out


def validate(manifests):
    """Error lines; empty when every manifest passes."""
    import jsonschema
    import kubernetes_validate as kv

    errors = []
    for source, doc in manifests:
        what = f"{source}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        crd = CRD_SCHEMAS.get((doc.get("apiVersion"), doc.get("kind")))
        if crd:
            schema = json.loads((SCHEMAS / crd).read_text())
            for e in jsonschema.Draft7Validator(schema).iter_errors(doc):
                errors.append(f"{what}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
            continue
        for version in K8S_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
            except (kv.ValidationError, jsonschema.ValidationError) as e:
                err = getattr(e, "caught", e)  # the package raises jsonschema's error as is
                path = ".".join(map(str, getattr(err, "absolute_path", [])))
                errors.append(f"{what} (k8s {version}): {path}: {getattr(err, 'message', err)}")
            except kv.SchemaNotFoundError as e:
                errors.append(f"{what} (k8s {version}): no schema: {e}")
    return errors


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, s):
    # Multi-line strings (the TOML config, dashboards) as literal blocks, readable in a diff.
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifests):
    parts = []
    for source, doc in manifests:
        body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
        parts.append(f"---\n# Source: {source}\n{body}")
    return "".join(parts)


K8S_HEADER = """\
# Plain manifests of the lmperf node agent, rendered from deploy/helm/lmperf with its default
# values (release `lmperf`, namespace `lmperf`). Do not edit: change the chart and run
#   .venv-peers/bin/python deploy/tools/render.py write-k8s
# Apply with: kubectl create namespace lmperf && kubectl apply -f deploy/k8s/lmperf.yaml
# Edit the ConfigMap's [[target]] first: the default target is an example.
"""


ALERTS_HEADER = """\
# lmperf's Prometheus alerting rules (docs/runbook.md has a section per alert), rendered from
# deploy/helm/lmperf (templates/prometheusrule.yaml) with its default `alerts` values. Do not
# edit: change the chart and run
#   .venv-peers/bin/python deploy/tools/render.py write-alerts
# Load it with `rule_files:` in prometheus.yml; check it with `promtool check rules`.
"""


def rules_text(values_files):
    """The PrometheusRule's spec (its `groups`) as a Prometheus rule file, `alerts.enabled` forced on."""
    values = {}
    for f in values_files:
        values = deep_merge(values, yaml.safe_load(Path(f).read_text()) or {})
    values = deep_merge(values, {"alerts": {"enabled": True}})
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
        yaml.safe_dump(values, tmp)
        tmp.flush()
        rules = [d for _, d in render([tmp.name]) if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise SystemExit(f"render.py: expected one PrometheusRule, got {len(rules)}")
    groups = {"groups": rules[0]["spec"]["groups"]}
    return yaml.dump(groups, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render the chart (like helm template)")
    r.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
    r.add_argument("--json", action="store_true", help="print [{source, manifest}] as JSON")
    r.add_argument("--validate", action="store_true", help="schema-check every manifest; exit 1 on errors")
    sub.add_parser("write-k8s", help=f"write {K8S_OUT.relative_to(ROOT)}")
    sub.add_parser("k8s-text", help="print what write-k8s would write")
    li = sub.add_parser("lint", help="helm lint; print its findings as JSON")
    li.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
    ru = sub.add_parser("rules", help="print the alerting rules (a Prometheus rule file) for the values")
    ru.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
    sub.add_parser("write-alerts", help=f"write {ALERTS_OUT.relative_to(ROOT)}")
    sub.add_parser("alerts-text", help="print what write-alerts would write")
    y = sub.add_parser("yaml2json", help="print each file's YAML documents as JSON")
    y.add_argument("files", nargs="+")
    a = p.parse_args()

    if a.cmd == "yaml2json":
        docs = {f: list(yaml.safe_load_all(Path(f).read_text())) for f in a.files}
        print(json.dumps(docs))
        return 0
    if a.cmd == "lint":
        import helm_python as helm

        values = {}
        for f in a.values:
            values = deep_merge(values, yaml.safe_load(Path(f).read_text()) or {})
        print(json.dumps(helm.lint(str(CHART), values=values)))
        return 0
    if a.cmd == "rules":
        sys.stdout.write(rules_text(a.values))
        return 0
    generated = {
        # command that writes, command that prints: (output file, its text)
        ("write-alerts", "alerts-text"): (ALERTS_OUT, lambda: ALERTS_HEADER + rules_text([])),
        ("write-k8s", "k8s-text"): (K8S_OUT, lambda: K8S_HEADER + to_yaml(render([]))),
    }
    for (write_cmd, print_cmd), (out, text) in generated.items():
        if a.cmd == print_cmd:
            sys.stdout.write(text())
            return 0
        if a.cmd == write_cmd:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text())
            return 0

    manifests = render(a.values)
    errors = validate(manifests) if a.validate else []
    if a.json:
        print(json.dumps({"manifests": [{"source": s, "manifest": d} for s, d in manifests], "errors": errors}))
    else:
        sys.stdout.write(to_yaml(manifests))
    for e in errors:
        print(f"render.py: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
