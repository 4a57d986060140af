"""Health check of the conductor image, for every role. Exit 0: healthy; 1: unhealthy.

It finds the container's `conductor` process (the entrypoint) in /proc and checks what that
role offers:

- `conductor api` / `conductor serve`: HTTP GET /healthz on the role's --port (default 8000)
  must answer 200.
- any other role with CONDUCTOR_METRICS_PORT set (aggregator, gateway, planner as the
  manifests run them): HTTP GET /healthz on that port must answer 200 (the role's liveness:
  the process still answers).
- `conductor planner` without CONDUCTOR_METRICS_PORT: the standard gRPC health service
  (service "") on the planner's port (--port, else the port of CONDUCTOR_PLANNER_ADDR, else
  50051) must say SERVING.
- anything else (an aggregator or gateway without CONDUCTOR_METRICS_PORT, a one-shot command
  such as `db upgrade`, or no conductor process found): only that the installed package imports.
  That proves the installation, not the process: such a role has no endpoint to ask.

Kubernetes ignores an image's HEALTHCHECK; the manifests use their own probes. Docker uses it,
and podman when the image is built in the docker format.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 4.0
ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def conductor_argv() -> list[str] | None:
    """The arguments after `conductor` of the container's conductor process, PID 1 first."""
    pids = sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        for index, arg in enumerate(argv[:3]):
            if os.path.basename(arg) == "conductor":
                return argv[index + 1 :]
    return None


def option(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def local_host(argv: list[str]) -> str:
    host = option(argv, "--host") or "127.0.0.1"
    return "127.0.0.1" if host in ANY_ADDRESS else host


def http_ok(host: str, port: str) -> bool:
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return False


def grpc_serving(host: str, port: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S
            )
        except grpc.RpcError as exc:
            print(f"healthcheck: gRPC health at {host}:{port}: {exc.code()}", file=sys.stderr)
            return False
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(f"healthcheck: planner at {host}:{port} is not serving", file=sys.stderr)
    return serving


def healthy() -> bool:
    argv = conductor_argv() or []
    role = argv[0] if argv else ""
    metrics_port = os.environ.get("CONDUCTOR_METRICS_PORT", "").strip()
    if role in ("api", "serve"):
        return http_ok(local_host(argv), option(argv, "--port") or "8000")
    if metrics_port:
        return http_ok("127.0.0.1", metrics_port)
    if role == "planner":
        port = option(argv, "--port")
        if port is None:
            addr = os.environ.get("CONDUCTOR_PLANNER_ADDR", "127.0.0.1:50051")
            port = addr.rpartition(":")[2] or "50051"
        return grpc_serving(local_host(argv), port)
    import conductor_cli  # noqa: F401  (the installation is intact)

    return True


if __name__ == "__main__":
    sys.exit(0 if healthy() else 1)
