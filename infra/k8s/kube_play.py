"""The dev overlay, rendered, made playable by `podman kube play --network host`, then checked as
Kubernetes would check it. Used by `infra/test-images.sh kube`; it runs inside the conductor
image (python3 there has PyYAML, gRPC and the project), on the host's network.

    kubectl kustomize infra/k8s/overlays/dev \
        | python3 kube_play.py transform ARGS --out-dir DIR > play.yaml
    python3 kube_play.py pods < play.yaml      # each pod's name and grace period
    python3 kube_play.py probe --view DIR/kubelet.json   # each probe, until it passes
    python3 kube_play.py ask --view DIR/kubelet.json --key KEY

transform keeps the overlay's workloads as they are (image, command and args, environment from
the ConfigMaps and Secrets, init containers, security context, volumes, grace periods) and
changes only what one host without a cluster, and podman 4.3 (Debian bookworm's), need:

- PostgreSQL and Redis are this machine's: their Deployments go, and the connections Secret
  points at a fresh database and at Redis under a key prefix;
- all pods share the host's network: the planner's address is 127.0.0.1 (podman ignores
  hostAliases there), and each role's metrics port (9464 in every pod) becomes one of its own,
  in its environment, its container port and the probes that name it;
- every workload is played as a Pod, the Job's with its restartPolicy (Never) and the
  Deployments' with OnFailure: under Always, podman 4.3 restarts a finished init container and
  never starts the pod's main container. The Job's pod comes first; the Deployments' init
  containers (`conductor db wait`) hold each role until its migrations have run;
- `$(VAR)` in command and args is expanded here, as the kubelet does (podman 4.3 does not);
- Secrets are written to --out-dir (secrets/NAME.json) for `podman secret create`: podman 4.3
  reads a secretKeyRef from its own secret store, as JSON of base64 values;
- only the gateways of queues the pool's workers use are played (the dev pool's: llamacpp;
  the other vendors' gateways differ only in their queue), and the two llama.cpp engines
  (planner, local worker) get one thread each, as on any 2-core machine;
- probes and declared ports are taken out of the played pods into --out-dir/kubelet.json:
  podman would run probes with curl, which the image does not have, through systemd timers,
  which these machines do not have, and it refuses declared ports on the host's network.
  `probe` runs them from outside, as the kubelet does; preStop hooks go too (podman has none);
- Services, NetworkPolicies, PodDisruptionBudgets, the Namespace and the ServiceAccount have no
  meaning to podman and are left out; so is the CronJob trace-prune (a schedule; its command,
  `conductor traces prune`, is tested on its own).
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
SERVED_BY_HOST = {"postgres", "redis"}  # Deployments replaced by this machine's servers
RUN_LABEL = "conductor.test/run"
METRICS_PORT_ENV = "CONDUCTOR_METRICS_PORT"
PROBE_DEADLINE_S = 300.0


def transform(docs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ConfigMaps, then the migrations' pod, then one pod per role to play; the Secrets and
    the probes go to ``args.out_dir``."""
    used_queues = _pool_queues(docs)
    planner_port = _planner_port(docs)
    configuration: list[dict[str, Any]] = []
    migrations: list[dict[str, Any]] = []
    roles: list[dict[str, Any]] = []
    metrics_ports = iter(args.metrics_ports)
    secrets = Path(args.out_dir) / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    for original in docs:
        doc = copy.deepcopy(original)
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "ConfigMap":
            if name.startswith("conductor-env"):
                doc["data"].update(
                    CONDUCTOR_PLANNER_ADDR=f"127.0.0.1:{planner_port}",
                    CONDUCTOR_REDIS_PREFIX=args.redis_prefix,
                    CONDUCTOR_LLAMACPP_THREADS="1",
                )
            doc["metadata"].pop("namespace", None)
            configuration.append(doc)
        elif kind == "Secret" and name.startswith("conductor-connections"):
            values = {
                "database-url": args.database_url,
                "broker-url": args.redis_url,
                "redis-url": args.redis_url,
            }
            encoded = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
            (secrets / f"{name}.json").write_text(json.dumps(encoded))
        elif kind == "Job":
            migrations.append(
                _pod(name, doc["spec"]["template"], "Never", docs, args, metrics_ports)
            )
        elif kind == "Deployment" and name not in SERVED_BY_HOST:
            queue = doc["metadata"].get("labels", {}).get("conductor/queue")
            if queue is None or queue in used_queues:
                template = doc["spec"]["template"]
                roles.append(_pod(name, template, "OnFailure", docs, args, metrics_ports))
    view = {pod["metadata"]["name"]: _kubelet_view(pod) for pod in migrations + roles}
    (Path(args.out_dir) / "kubelet.json").write_text(json.dumps(view, indent=2))
    return configuration + migrations + roles


def _pool_queues(docs: list[dict[str, Any]]) -> set[str]:
    """The gateway queues the pool ConfigMap's workers are called on."""
    from conductor.messaging import queue_for
    from conductor.pool import parse_pool

    pool_map = next(d for d in docs if _is_config_map(d, "conductor-pool"))
    pool = parse_pool(yaml.safe_load(pool_map["data"]["pool.yaml"]), "the pool ConfigMap")
    return {queue_for(worker) for worker in pool.workers}


def _pod(
    name: str,
    template: dict[str, Any],
    restart: str,
    docs: list[dict[str, Any]],
    args: argparse.Namespace,
    ports: Iterator[int],
) -> dict[str, Any]:
    """A pod template as one host plays it, its metrics port its own."""
    spec = copy.deepcopy(template["spec"])
    spec["restartPolicy"] = restart
    for container in spec.get("initContainers", []) + spec["containers"]:
        _own_metrics_port(container, ports)
        _expand_variables(container, docs)
        container.pop("lifecycle", None)
    labels = {**template["metadata"].get("labels", {}), RUN_LABEL: args.label}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def _kubelet_view(pod: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each container's named ports and probes, taken out of the pod (on the host's network,
    podman 4.3 refuses declared ports, and runs probes itself only through systemd)."""
    view = {}
    for container in pod["spec"]["containers"]:
        ports = {p["name"]: p["containerPort"] for p in container.pop("ports", [])}
        probes = {kind: container.pop(kind) for kind in PROBES if kind in container}
        view[container["name"]] = {"ports": ports, "probes": probes}
    return view


def _own_metrics_port(container: dict[str, Any], ports: Iterator[int]) -> None:
    var = next((v for v in container.get("env", []) if v["name"] == METRICS_PORT_ENV), None)
    if var is None:
        return
    port = next(ports)
    old = int(var["value"])
    var["value"] = str(port)
    for declared in container.get("ports", []):
        if declared["containerPort"] == old:
            declared["containerPort"] = port
    for kind in PROBES:
        check = container.get(kind, {}).get("httpGet")
        if check is not None and check["port"] == old:
            check["port"] = port


def _expand_variables(container: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """Kubernetes' ``$(VAR)`` in command and args, from the container's plain values and its
    ConfigMaps (an unknown name stays as written, as the kubelet leaves it)."""
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef", {}).get("name")
        values.update(next(d for d in docs if _is_config_map(d, ref))["data"] if ref else {})
    values.update({v["name"]: v["value"] for v in container.get("env", []) if "value" in v})
    for field in ("command", "args"):
        if field in container:
            container[field] = [
                re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), arg)
                for arg in container[field]
            ]


def _is_config_map(doc: dict[str, Any], name: str) -> bool:
    return doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith(name)


def _planner_port(docs: list[dict[str, Any]]) -> int:
    """The gRPC port the rendered planner Deployment serves on."""
    planner = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "planner"
    )
    ports = planner["spec"]["template"]["spec"]["containers"][0]["ports"]
    return int(next(p["containerPort"] for p in ports if p["name"] == "grpc"))


# -- checks, as the kubelet and a client would make them ----------------------------------------


# What the kubelet acts on, per pod and container: {"ports": {name: port}, "probes": {kind: probe}}
KubeletView = dict[str, dict[str, dict[str, dict[str, Any]]]]


def probe_passes(check: dict[str, Any], ports: dict[str, int]) -> bool:
    timeout = check.get("timeoutSeconds", 1)
    try:
        if "httpGet" in check:
            port = ports.get(check["httpGet"]["port"], check["httpGet"]["port"])
            url = f"http://127.0.0.1:{port}{check['httpGet']['path']}"
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return bool(200 <= response.status < 400)
        if "grpc" in check:
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            with grpc.insecure_channel(f"127.0.0.1:{check['grpc']['port']}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=check["grpc"].get("service", "")),
                    timeout=timeout,
                )
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except (OSError, urllib.error.URLError):
        return False
    except Exception as exc:  # grpc.RpcError: not serving yet
        if type(exc).__module__.startswith("grpc"):
            return False
        raise
    raise SystemExit(f"a probe of a kind this check does not run: {sorted(check)}")


def probe(view: KubeletView) -> int:
    """Every probe of every played container, until each has passed once."""
    pending = [
        (pod, kind, check, container["ports"])
        for pod, containers in view.items()
        for container in containers.values()
        for kind, check in container["probes"].items()
    ]
    if not pending:
        raise SystemExit("no probes in the played manifests")
    started = time.monotonic()
    while pending and time.monotonic() - started < PROBE_DEADLINE_S:
        for item in list(pending):
            if probe_passes(item[2], item[3]):
                took = time.monotonic() - started
                print(f"{took:6.1f} s  {item[0]}: {item[1]} passes", file=sys.stderr)
                pending.remove(item)
        time.sleep(1)
    for pod, kind, _, _ in pending:
        print(f"NOT OK: {pod}: {kind} never passed in {PROBE_DEADLINE_S:g} s", file=sys.stderr)
    return 1 if pending else 0


def ask(view: KubeletView, key: str, model: str) -> int:
    """One question through the API's chat completions; the workflow completed; every role's
    metrics port serves the project's metrics."""
    base = f"http://127.0.0.1:{view['api']['conductor']['ports']['http']}"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def call(method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    asked = time.monotonic()
    question = {"model": model, "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
    status, body = call("POST", "/v1/chat/completions", question, timeout=600)
    if status != 200:
        print(f"NOT OK: chat completions: HTTP {status}: {body[:2000]!r}", file=sys.stderr)
        return 1
    reply = json.loads(body)
    answer = reply["choices"][0]["message"]["content"].strip()
    workflow_id = reply["conductor"]["workflow_id"]
    took = time.monotonic() - asked
    print(f"ok: answered through the API in {took:.1f} s: {answer[:100]!r}", file=sys.stderr)
    status, body = call("GET", f"/v1/workflows/{workflow_id}")
    workflow = json.loads(body)
    if status != 200 or workflow["status"] != "completed":
        print(f"NOT OK: workflow {workflow_id}: HTTP {status}: {body[:1000]!r}", file=sys.stderr)
        return 1
    steps = len(workflow["steps"])
    print(f"ok: workflow {workflow_id} completed, {steps} step(s)", file=sys.stderr)
    failures = 0
    for pod, containers in view.items():
        for container in containers.values():
            for name, port in container["ports"].items():
                if name != "metrics":  # the API's HTTP port refuses /metrics (keys exist)
                    continue
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    lines = r.read().decode().splitlines()
                families = sum(
                    line.startswith(("# TYPE conductor_", "# TYPE gen_ai_")) for line in lines
                )
                failures += families == 0
                verdict = "ok" if families else "NOT OK"
                print(f"{verdict}: {pod} /metrics on {port}: {families} families", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    play = commands.add_parser(
        "transform", help="rendered overlay (stdin) -> pods to play (stdout)"
    )
    play.add_argument("--database-url", required=True)
    play.add_argument("--redis-url", required=True)
    play.add_argument("--redis-prefix", required=True)
    play.add_argument("--label", required=True, help=f"value of the pods' label {RUN_LABEL}")
    play.add_argument("--out-dir", required=True, help="where secrets/*.json and kubelet.json go")
    play.add_argument(
        "--metrics-ports",
        required=True,
        type=lambda s: [int(p) for p in s.split(",")],
        help="free host ports, comma-separated, one per role with a metrics port",
    )
    commands.add_parser("pods", help="pods to play (stdin): each one's name and grace period")
    checks = commands.add_parser("probe", help="run every probe until each passes")
    checks.add_argument("--view", required=True, type=Path, help="kubelet.json of transform")
    question = commands.add_parser("ask", help="one workflow through the API, then every /metrics")
    question.add_argument("--view", required=True, type=Path, help="kubelet.json of transform")
    question.add_argument("--key", required=True)
    question.add_argument("--model", default="conductor-mini")
    args = parser.parse_args()
    if args.command == "probe":
        return probe(json.loads(args.view.read_text()))
    if args.command == "ask":
        return ask(json.loads(args.view.read_text()), args.key, args.model)
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    if args.command == "pods":
        for pod in docs:
            if pod["kind"] == "Pod":
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                print(pod["metadata"]["name"], grace)
        return 0
    yaml.safe_dump_all(transform(docs, args), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
