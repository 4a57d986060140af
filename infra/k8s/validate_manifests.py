"""Checks of the rendered manifests and the Grafana dashboard (run by validate.sh, in the tools'
virtual environment).

    python validate_manifests.py manifests --kubernetes-version 1.32.0 RENDERED.yaml...
    python validate_manifests.py dashboard DASHBOARD.json

manifests:
- every document of a core kind is validated by kubernetes-validate against the pinned
  Kubernetes version's strict schema (unknown fields are errors);
- KEDA ScaledObject/TriggerAuthentication and Prometheus Operator ServiceMonitor/PodMonitor/
  PrometheusRule documents are parsed with the cloudcoil models of those CRDs; those models
  ignore unknown fields, so every field of the document that the parsed model does not carry
  is reported as an error (extra fields forbidden);
- a document of any other kind is an error (nothing here may depend on an unchecked CRD);
- the metric names in PrometheusRule expressions and KEDA Prometheus queries are the roles'
  (below), with label matchers only on the labels each metric has;
- the gateways and their ScaledObjects agree: each ScaledObject scales an existing gateway
  Deployment that has no replica count of its own, on that gateway's queue, with a target per
  replica equal to the gateway's concurrency; each gateway's grace period exceeds the step
  deadline.
dashboard: the JSON parses, every panel has a query, every query uses only the roles' metrics
and labels, and every metric has a panel.

Exit status 1 with one line per problem, 0 with a summary.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

# The metrics every role exports, with their kinds and labels, as docs/metrics.md lists them.
# This script runs without the project installed (in the tools' environment), so the list is
# written out here; tests/infra/test_metric_names.py holds it equal to the code's registries.
HISTOGRAM = "histogram"
METRICS: dict[str, tuple[str, frozenset[str]]] = {
    name: (kind, frozenset(labels))
    for name, kind, labels in [
        # gateway
        (
            "gen_ai_client_operation_duration_seconds",
            HISTOGRAM,
            ["worker", "gen_ai_provider_name", "gen_ai_request_model", "outcome"],
        ),
        (
            "gen_ai_client_token_usage",
            HISTOGRAM,
            ["worker", "gen_ai_provider_name", "gen_ai_token_type"],
        ),
        ("conductor_gateway_calls_total", "counter", ["worker", "queue", "outcome", "status"]),
        ("conductor_gateway_cost_usd_total", "counter", ["worker"]),
        ("conductor_gateway_retries_total", "counter", ["worker"]),
        ("conductor_gateway_fallbacks_total", "counter", ["worker"]),
        ("conductor_gateway_quota_wait_seconds", HISTOGRAM, ["worker"]),
        ("conductor_gateway_calls_in_flight", "gauge", ["queue"]),
        # aggregator
        ("conductor_workflows_total", "counter", ["variant", "outcome"]),
        ("conductor_workflow_duration_seconds", HISTOGRAM, ["variant", "outcome"]),
        ("conductor_step_duration_seconds", HISTOGRAM, ["worker", "outcome"]),
        ("conductor_planner_call_duration_seconds", HISTOGRAM, []),
        ("conductor_plans_total", "counter", ["valid"]),
        ("conductor_aggregator_messages_total", "counter", ["kind", "outcome"]),
        ("conductor_sweeper_actions_total", "counter", ["action"]),
        ("conductor_queue_backlog", "gauge", ["queue"]),
        # planner
        ("gen_ai_server_request_duration_seconds", HISTOGRAM, ["backend", "outcome"]),
        ("conductor_planner_plans_total", "counter", ["backend", "valid"]),
        ("conductor_planner_tokens_total", "counter", ["backend", "kind"]),
        ("conductor_planner_batch_size", HISTOGRAM, ["backend"]),
        # API
        ("conductor_http_requests_total", "counter", ["method", "route", "status"]),
        ("conductor_http_request_duration_seconds", HISTOGRAM, ["method", "route"]),
        ("conductor_workflows_submitted_total", "counter", ["variant"]),
        ("conductor_passthrough_calls_total", "counter", ["worker", "outcome"]),
        ("conductor_api_tokens_total", "counter", ["tenant", "variant", "kind"]),
        ("conductor_api_cost_usd_total", "counter", ["tenant", "variant"]),
        ("conductor_api_key_budget_remaining_usd", "gauge", ["key_id"]),
        ("conductor_api_key_limit_refusals_total", "counter", ["reason"]),
        ("conductor_api_workflows_total", "counter", ["variant", "outcome"]),
    ]
}
# Labels Prometheus attaches to every scraped series: the target's (the PodMonitor's and
# ServiceMonitor's relabelings add role and gateway_queue).
TARGET_LABELS = frozenset(
    {
        "job",
        "instance",
        "namespace",
        "pod",
        "container",
        "service",
        "endpoint",
        "role",
        "gateway_queue",
    }
)
# Series Prometheus makes itself, allowed in alert expressions (not in the dashboard).
PROMETHEUS_SERIES: dict[str, frozenset[str]] = {"up": frozenset()}

PROMQL_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    }
)
PROMQL_LITERALS = frozenset({"inf", "nan"})

CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
STEP_DEADLINE_S = 600


# ---------------------------------------------------------------------------------- PromQL


def series_of(metric: str) -> tuple[str, frozenset[str]] | None:
    """The metric a series name belongs to (a histogram's _bucket, _sum, _count), and
    the labels a selector on that series may use."""
    if metric in METRICS:
        kind, labels = METRICS[metric]
        return (metric, labels) if kind != HISTOGRAM else None
    for suffix in ("_bucket", "_sum", "_count"):
        base = metric.removesuffix(suffix)
        if base != metric and base in METRICS and METRICS[base][0] == HISTOGRAM:
            labels = METRICS[base][1]
            return base, labels | {"le"} if suffix == "_bucket" else labels
    return None


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*$")


def promql_problems(
    expr: str, allowed_extra: dict[str, frozenset[str]]
) -> tuple[list[str], set[str]]:
    """Problems with the metric names and label matchers of one PromQL expression, and the
    metrics it uses. A light tokenizer, not a parser: strings, ranges, grouping
    clauses and function names are set aside; every remaining identifier is a series name."""
    problems: list[str] = []
    used: set[str] = set()
    # Label matchers, read before strings are blanked (a matcher is `label op "value"`).
    for match in _SELECTOR.finditer(expr):
        name, body = match.group(1), match.group(2)
        if name is None:
            problems.append(f"selector without a metric name: {match.group(0)!r}")
            continue
        labels = _label_names(body)
        if labels is None:
            problems.append(f"cannot read the label matchers of {match.group(0)!r}")
            continue
        known = series_of(name)
        allowed = known[1] if known else allowed_extra.get(name)
        if allowed is None:
            continue  # reported below as an unknown metric
        unknown = sorted(set(labels) - allowed - TARGET_LABELS)
        if unknown:
            problems.append(f"{name} has no label {', '.join(unknown)}")
    text = _STRING.sub('""', expr)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    for match in _IDENT.finditer(text):
        ident = match.group(1)
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if ident in PROMQL_KEYWORDS or ident.lower() in PROMQL_LITERALS:
            continue
        if re.fullmatch(r"[0-9.]+(e[0-9]+)?", ident):
            continue
        known = series_of(ident)
        if known is not None:
            used.add(known[0])
        elif ident not in allowed_extra:
            problems.append(f"metric {ident!r} is not one the roles export")
    if not used and not any(name in expr for name in allowed_extra):
        problems.append("no metric the roles export in the expression")
    return problems, used


def _label_names(body: str) -> list[str] | None:
    names = []
    for part in _split_matchers(body):
        if not part.strip():
            continue
        head = _STRING.sub("", part)
        m = _MATCHER.match(head)
        if m is None:
            return None
        names.append(m.group(1))
    return names


def _split_matchers(body: str) -> Iterator[str]:
    depth_quote: str | None = None
    current = []
    escaped = False
    for ch in body:
        if depth_quote:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == depth_quote:
                depth_quote = None
            continue
        if ch in "\"'`":
            depth_quote = ch
            current.append(ch)
        elif ch == ",":
            yield "".join(current)
            current = []
        else:
            current.append(ch)
    yield "".join(current)


# ------------------------------------------------------------------------------- manifests


def load_documents(paths: Iterable[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def where(path: Path, doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace", "-")
    return f"{path.name}: {doc.get('kind')} {ns}/{meta.get('name')}"


@functools.cache
def _crd_models() -> dict[tuple[str, str], Any]:
    from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule, ServiceMonitor

    return {
        ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
        ("keda.sh/v1alpha1", "TriggerAuthentication"): TriggerAuthentication,
        ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor,
        ("monitoring.coreos.com/v1", "PodMonitor"): PodMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
    }


def extra_fields(given: Any, parsed: Any, at: str = "") -> Iterator[str]:
    """Paths present in the document but absent from the model's dump: fields the model does
    not know (it ignores them rather than failing)."""
    if isinstance(given, dict):
        if not isinstance(parsed, dict):
            yield at or "."
            return
        for key, value in given.items():
            path = f"{at}.{key}" if at else str(key)
            if key not in parsed:
                yield path
            else:
                yield from extra_fields(value, parsed[key], path)
    elif isinstance(given, list) and isinstance(parsed, list):
        for i, (g, p) in enumerate(zip(given, parsed, strict=False)):
            yield from extra_fields(g, p, f"{at}[{i}]")


def validate_crd(doc: dict[str, Any]) -> list[str]:
    from pydantic import ValidationError

    model = _crd_models()[(doc["apiVersion"], doc["kind"])]
    try:
        parsed = model.model_validate(doc)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"{path}: field not in the {doc['kind']} schema" for path in extra_fields(doc, dumped)]


def validate_core(doc: dict[str, Any], version: str) -> list[str]:
    import kubernetes_validate
    from kubernetes_validate import utils

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except utils.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{path or '.'}: {exc.message}"]
    except utils.SchemaNotFoundError:
        return [f"no schema for {doc.get('apiVersion')} {doc.get('kind')} in Kubernetes {version}"]
    return []


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", []) if "name" in e}


def consistency_problems(docs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    problems: list[str] = []
    for path in dict.fromkeys(p for p, _ in docs):
        rendered = [d for p, d in docs if p == path]
        gateways = {
            d["metadata"]["name"]: d
            for d in rendered
            if d.get("kind") == "Deployment"
            and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "gateway"
        }
        problems += [f"{path.name}: {p}" for p in gateway_problems(gateways)]
        for doc in rendered:
            if doc.get("kind") == "ScaledObject":
                problems += [f"{path.name}: {p}" for p in scaledobject_problems(doc, gateways)]
    return problems


def gateway_problems(gateways: dict[str, dict[str, Any]]) -> Iterator[str]:
    for name, deployment in gateways.items():
        spec = deployment["spec"]["template"]["spec"]
        env = _container_env(spec["containers"][0])
        if not env.get("CONDUCTOR_GATEWAY_QUEUE", "").startswith("gateway."):
            yield f"Deployment {name} has no gateway queue"
        if spec.get("terminationGracePeriodSeconds", 30) <= STEP_DEADLINE_S:
            yield (
                f"Deployment {name}: terminationGracePeriodSeconds must exceed the step "
                f"deadline ({STEP_DEADLINE_S} s)"
            )


def scaledobject_problems(
    doc: dict[str, Any], gateways: dict[str, dict[str, Any]]
) -> Iterator[str]:
    name = doc["metadata"]["name"]
    target = doc["spec"]["scaleTargetRef"]["name"]
    deployment = gateways.get(target)
    if deployment is None:
        yield f"ScaledObject {name} scales {target}, which is no gateway Deployment"
        return
    if "replicas" in deployment["spec"]:
        yield f"Deployment {target} sets spec.replicas though KEDA scales it"
    env = _container_env(deployment["spec"]["template"]["spec"]["containers"][0])
    queue = env.get("CONDUCTOR_GATEWAY_QUEUE")
    concurrency = env.get("CONDUCTOR_GATEWAY_CONCURRENCY")
    for trigger in doc["spec"]["triggers"]:
        meta = trigger.get("metadata", {})
        if trigger["type"] == "rabbitmq":
            target_value, queues = meta.get("value"), {meta.get("queueName")}
            if meta.get("protocol") != "http" or meta.get("mode") != "QueueLength":
                yield (
                    f"ScaledObject {name}: the rabbitmq trigger needs protocol http and mode "
                    "QueueLength (ready + unacknowledged messages)"
                )
        elif trigger["type"] == "prometheus":
            target_value = meta.get("threshold")
            queues = set(re.findall(r'queue="([^"]+)"', meta.get("query", "")))
        else:
            yield f"ScaledObject {name}: unexpected trigger {trigger['type']}"
            continue
        if queues != {queue}:
            yield (
                f"ScaledObject {name} counts {sorted(q or '' for q in queues)}, the gateway "
                f"consumes {queue}"
            )
        if target_value != concurrency:
            yield (
                f"ScaledObject {name}: target {target_value} per replica, but the gateway's "
                f"concurrency is {concurrency}"
            )


def promql_in(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if doc["kind"] == "PrometheusRule":
        for group in doc["spec"]["groups"]:
            for rule in group["rules"]:
                yield rule.get("alert") or rule.get("record") or "?", rule["expr"]
    elif doc["kind"] == "ScaledObject":
        for trigger in doc["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                yield f"trigger of {doc['metadata']['name']}", trigger["metadata"]["query"]


def check_manifests(paths: list[Path], version: str) -> int:
    problems: list[str] = []
    counts = {"core": 0, "crd": 0}
    docs = list(load_documents(paths))
    for path, doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            problems.append(f"{path.name}: a document without kind or apiVersion")
            continue
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            counts["crd"] += 1
            errors = validate_crd(doc)
            for name, expr in promql_in(doc):
                found, _ = promql_problems(expr, PROMETHEUS_SERIES)
                errors += [f"{name}: {p}" for p in found]
        else:
            counts["core"] += 1
            errors = validate_core(doc, version)
        problems += [f"{where(path, doc)}: {e}" for e in errors]
    problems += consistency_problems(docs)
    for line in problems:
        print(f"ERROR {line}")
    if problems:
        return 1
    print(
        f"manifests: {len(paths)} renders valid: {counts['core']} core documents (Kubernetes "
        f"{version}, strict), {counts['crd']} CRD documents (cloudcoil models, no unknown "
        "fields); gateways and ScaledObjects agree"
    )
    return 0


# ------------------------------------------------------------------------------- dashboard


def dashboard_queries(node: Any) -> Iterator[tuple[str, str]]:
    """(panel title, expression) for every query of every panel, rows' panels and templating
    variables included."""
    if isinstance(node, dict):
        for panel in node.get("panels", []):
            if panel.get("type") != "row":
                targets = panel.get("targets") or []
                if not targets:
                    yield panel.get("title", "?"), ""
                for target in targets:
                    yield panel.get("title", "?"), target.get("expr", "")
            yield from dashboard_queries(panel)
        for variable in node.get("templating", {}).get("list", []):
            if variable.get("type") == "query":
                query = variable.get("query")
                text = query.get("query", "") if isinstance(query, dict) else str(query or "")
                inner = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_]+\)\s*", text)
                yield f"variable {variable.get('name')}", inner.group(1) if inner else text


def check_dashboard(path: Path) -> int:
    try:
        dashboard = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        print(f"ERROR {path.name}: not JSON: {exc}")
        return 1
    problems: list[str] = []
    used: set[str] = set()
    queries = list(dashboard_queries(dashboard))
    for title, expr in queries:
        if not expr.strip():
            problems.append(f"panel {title!r} has no query")
            continue
        found, metrics = promql_problems(expr, {})
        used |= metrics
        problems += [f"panel {title!r}: {p}" for p in found]
    missing = sorted(set(METRICS) - used)
    if missing:
        problems.append(f"no panel shows {', '.join(missing)}")
    for line in problems:
        print(f"ERROR {path.name}: {line}")
    if problems:
        return 1
    print(
        f"dashboard: {path.name} parses; {len(queries)} queries use only the roles' metrics, "
        f"all {len(METRICS)} of them"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    manifests = sub.add_parser("manifests")
    manifests.add_argument("--kubernetes-version", required=True)
    manifests.add_argument("files", nargs="+", type=Path)
    dashboard = sub.add_parser("dashboard")
    dashboard.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "manifests":
        return check_manifests(args.files, args.kubernetes_version)
    return check_dashboard(args.file)


if __name__ == "__main__":
    sys.exit(main())
