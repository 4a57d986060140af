"""A role's own HTTP port for Prometheus and Kubernetes: ``/metrics``, ``/healthz``, ``/readyz``.

The planner, the aggregator and the gateway are not HTTP servers, so each serves these on the
port ``CONDUCTOR_METRICS_PORT`` names. Each role is one process (Celery's thread pool, one
asyncio loop), so one registry per process holds all of its metrics: no multi-process mode is
needed, and a pod is the unit that scales. ``/healthz`` says the process can still answer
(liveness: it never asks the database or the broker, whose outage a restart would not fix);
``/readyz`` says its dependencies answer (readiness).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

logger = logging.getLogger(__name__)

Check = Callable[[], bool]
StartResponse = Callable[..., Any]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scrape never holds up the process's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes arrive every few seconds: not worth a log line each."""


class MetricsServer:
    """Serves ``registry`` and the two probes on ``host:port`` from a daemon thread: liveness is
    the answer itself, readiness is ``ready``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        port: int,
        host: str = "0.0.0.0",  # scraped and probed from outside the pod
        ready: Check | None = None,
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self._ready = ready or (lambda: True)
        self._server = make_server(
            host, port, self._app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="conductor-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def start(self) -> MetricsServer:
        self._thread.start()
        logger.info("metrics and health checks on port %d", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        if path in ("/healthz", "/readyz"):
            ok = path == "/healthz" or _passes(self._ready)
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if ok else b"not ok\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: /metrics, /healthz and /readyz are served here\n"]


def _passes(check: Check) -> bool:
    """A check that raises has failed; the reason goes to the log, not to the prober."""
    try:
        return bool(check())
    except Exception as exc:
        logger.warning("health check failed: %s: %s", type(exc).__name__, exc)
        return False


def start_metrics_server(
    registry: CollectorRegistry,
    port: int | None,
    *,
    ready: Check | None = None,
) -> MetricsServer | None:
    """The role's metrics server on ``port``, started; None when ``port`` is None (unset)."""
    if port is None:
        return None
    return MetricsServer(registry, port=port, ready=ready).start()
