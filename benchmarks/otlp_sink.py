"""A local OTLP/HTTP trace receiver for benchmarks: takes ``POST /v1/traces`` (protobuf), counts
the spans, and answers as a collector does. It stands in for the collector an operator runs,
so a traced server's export costs what it would, and the receiver's own work is not the
server's."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class OtlpSink:
    """``with OtlpSink() as sink``: ``sink.endpoint`` to export to, ``sink.spans`` received."""

    def __init__(self) -> None:
        self.spans = 0
        self.services: set[str] = set()
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                sink.take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self._lock:
            for resource_spans in request.resource_spans:
                for attribute in resource_spans.resource.attributes:
                    if attribute.key == "service.name":
                        self.services.add(attribute.value.string_value)
                self.spans += sum(len(scope.spans) for scope in resource_spans.scope_spans)

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
