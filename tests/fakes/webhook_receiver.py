"""A webhook receiver on loopback that verifies Standard Webhooks signatures, as a client's
would, and can be told to fail its first deliveries or to redirect them."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError


class WebhookReceiver:
    def __init__(self, secret: str, *, failures: int = 0, redirect_to: str | None = None) -> None:
        self.webhook = Webhook(secret)
        self.failures_left = failures
        self.attempts: list[dict[str, str]] = []  # the headers of every request
        self.delivered: list[dict[str, Any]] = []  # verified payloads, answered 2xx
        self.rejected: list[str] = []  # why a request's signature did not verify
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.attempts.append(headers)
                if redirect_to is not None:
                    self.send_response(307)  # 307: a client that follows it POSTs again
                    self.send_header("location", redirect_to)
                    self.end_headers()
                    return
                try:
                    receiver.webhook.verify(body, headers)
                except WebhookVerificationError as exc:
                    receiver.rejected.append(str(exc))
                    self.send_response(400)
                    self.end_headers()
                    return
                if receiver.failures_left > 0:
                    receiver.failures_left -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.delivered.append(json.loads(body))
                receiver.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/conductor"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
