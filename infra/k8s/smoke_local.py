"""Runs the dev overlay's workloads as local processes, as the manifests run them, and checks
them as Kubernetes would: a test of the manifests' commands, environment and probes against
the code, without a cluster or an image.

    kubectl kustomize infra/k8s/overlays/dev > /tmp/dev.yaml
    .venv/bin/python infra/k8s/smoke_local.py /tmp/dev.yaml

Needs the project's virtual environment (its `conductor` is run), PostgreSQL and Redis on this
machine (as the tests do: SMOKE_POSTGRES_URL, default postgresql+psycopg://postgres@127.0.0.1:5432,
and SMOKE_REDIS_URL, default redis://127.0.0.1:6379/11), and the ports 8000, 50051, 50052 and
9470-9479 free.

What it does, in the manifests' order: the Job db-upgrade's command on a fresh database; an API
key (`conductor keys create`, the README's step); each Deployment's init containers, then its
container (args with $(VAR) expanded, env from its ConfigMaps and plain values; the Secrets'
URLs point at the local services; one gateway of the four cloud vendors, whose pods differ only
in their queue); every startup, liveness and readiness probe until it passes (4 min at most);
one question through the API's chat completions (conductor-mini, answered by the local
model); SIGTERM to every process, each of which must exit 0. What differs from a pod: the
planner address is 127.0.0.1 (no Service), each process gets its own metrics port (one host),
the pool and the XDG directories are local paths, and no read-only root filesystem, uid or
network policy applies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONDUCTOR = ROOT / ".venv" / "bin" / "conductor"
POOL = ROOT / "infra" / "k8s" / "overlays" / "dev" / "pool.yaml"
POSTGRES = os.environ.get("SMOKE_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS = os.environ.get("SMOKE_REDIS_URL", "redis://127.0.0.1:6379/11")
DATABASE = "conductor_k8s_smoke"
FIRST_METRICS_PORT = 9470
SKIPPED = {"postgres", "redis", "gateway-anthropic", "gateway-gemini", "gateway-openai-compatible"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def main(render: Path) -> int:
    docs = [d for d in yaml.safe_load_all(render.read_text()) if d]
    config_maps = {
        d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"
    }
    work = Path(tempfile.mkdtemp(prefix="conductor-k8s-smoke-"))
    secrets = {
        "database-url": f"{POSTGRES}/{DATABASE}",
        "broker-url": REDIS,
        "redis-url": REDIS,
    }

    def environment(container: dict[str, Any], metrics_port: int) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{CONDUCTOR.parent}:{env['PATH']}"  # the image's python is its venv's
        for source in container.get("envFrom", []):
            env.update(config_maps[source["configMapRef"]["name"]])
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            elif var["valueFrom"]["secretKeyRef"]["name"].startswith("conductor-connections"):
                env[var["name"]] = secrets[var["valueFrom"]["secretKeyRef"]["key"]]
        env.update(
            CONDUCTOR_POOL_FILE=str(POOL),
            CONDUCTOR_PLANNER_ADDR="127.0.0.1:50051",
            CONDUCTOR_REDIS_PREFIX="conductor-k8s-smoke:",
            XDG_CACHE_HOME=str(work / "cache"),
            XDG_DATA_HOME=str(work / "data"),
        )
        if "CONDUCTOR_METRICS_PORT" in env:
            env["CONDUCTOR_METRICS_PORT"] = str(metrics_port)
        return env

    admin = POSTGRES.replace("postgresql+psycopg", "postgresql") + "/postgres"
    for sql in (f"DROP DATABASE IF EXISTS {DATABASE}", f"CREATE DATABASE {DATABASE}"):
        subprocess.run(["psql", admin, "-qc", sql], check=True)

    job = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    container = job["containers"][0]
    run = subprocess.run(
        [str(CONDUCTOR), *container["args"]],
        env=environment(container, 0),
        text=True,
        capture_output=True,
        check=True,
    )
    print(f"job db-upgrade: {run.stdout.strip()}")
    key = subprocess.run(
        [str(CONDUCTOR), "keys", "create", "--tenant", "smoke"],
        env=environment(container, 0),
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()

    processes: dict[str, subprocess.Popen[bytes]] = {}
    checks: dict[str, tuple[dict[str, Any], dict[str, int]]] = {}
    failures: list[str] = []
    metrics_port = FIRST_METRICS_PORT
    try:
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["kind"] != "Deployment" or name in SKIPPED:
                continue
            spec = doc["spec"]["template"]["spec"]
            for init in spec.get("initContainers", []):
                done = subprocess.run(
                    init.get("command", [str(CONDUCTOR)]) + init.get("args", []),
                    env=environment(init, 0),
                    text=True,
                    capture_output=True,
                    timeout=120,
                )
                print(f"{name}: init container {init['name']} exited {done.returncode}")
                if done.returncode:
                    failures.append(f"{name}: init container {init['name']}: {done.stderr[-300:]}")
            container = spec["containers"][0]
            env = environment(container, metrics_port)
            args = [expand(a, env) for a in container["args"]]
            log = (work / f"{name}.log").open("wb")
            processes[name] = subprocess.Popen(
                [str(CONDUCTOR), *args], env=env, stdout=log, stderr=log
            )
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            if "metrics" in ports:
                ports["metrics"] = metrics_port
                metrics_port += 1
            checks[name] = (container, ports)
            print(f"{name}: conductor {' '.join(args)}")

        started = time.monotonic()
        pending = {(name, kind) for name in checks for kind in PROBES}
        while pending and time.monotonic() - started < 240:
            for name, kind in sorted(pending):
                if processes[name].poll() is not None:
                    failures.append(
                        f"{name} exited {processes[name].returncode} (log: {work}/{name}.log)"
                    )
                    pending = {p for p in pending if p[0] != name}
                elif probe(checks[name][0][kind], checks[name][1]):
                    print(f"{time.monotonic() - started:5.1f} s  {name}: {kind} passes")
                    pending.discard((name, kind))
            time.sleep(1)
        failures += [f"{name}: {kind} never passed" for name, kind in sorted(pending)]

        if not failures:
            question = {
                "model": "conductor-mini",
                "messages": [{"role": "user", "content": "What is 17 * 23?"}],
            }
            request = urllib.request.Request(
                "http://127.0.0.1:8000/v1/chat/completions",
                json.dumps(question).encode(),
                {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            asked = time.monotonic()
            with urllib.request.urlopen(request, timeout=300) as response:
                answer = json.load(response)["choices"][0]["message"]["content"]
            took = time.monotonic() - asked
            print(f"answered through the API in {took:.1f} s: {answer.strip()[:80]!r}")
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for name, process in processes.items():
            try:
                outcome = f"exit {process.wait(timeout=120)}"
            except subprocess.TimeoutExpired:
                process.kill()
                outcome = "still running after 120 s, killed"
            print(f"{name}: SIGTERM -> {outcome}")
            if outcome != "exit 0":
                failures.append(f"{name}: SIGTERM -> {outcome} (log: {work}/{name}.log)")
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {DATABASE}"], check=False)

    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a container argument."""
    return re.sub(r"\$\(([A-Za-z_]+)\)", lambda m: env[m.group(1)], arg)


def probe(check: dict[str, Any], ports: dict[str, int]) -> bool:
    try:
        if "httpGet" in check:
            port = check["httpGet"]["port"]
            url = f"http://127.0.0.1:{ports.get(port, port)}{check['httpGet']['path']}"
            with urllib.request.urlopen(url, timeout=check.get("timeoutSeconds", 1)) as response:
                return bool(200 <= response.status < 400)
        if "grpc" in check:
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            with grpc.insecure_channel(f"127.0.0.1:{check['grpc']['port']}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=check["grpc"].get("service", "")),
                    timeout=check.get("timeoutSeconds", 1),
                )
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except Exception:
        return False
    raise ValueError(f"probe kind not handled: {sorted(check)}")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
