"""Redaction: provider keys kept out of traces, internal addresses out of what tenants read.

A trace never holds a provider key.

Pool snapshots are built from WorkerSpec, which holds only the *name* of a key variable, but a
trace is forever: credential fields are dropped, and the value of every secret-looking
environment variable is blanked wherever it appears (a Gemini ``?key=`` URL, an error message
that echoes the key).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
# Keys that hold credentials in a worker dict; "api_key_env" (a variable's name) is kept.
_SECRET_KEY = re.compile(
    r"^(api_?key|key|secret|password|passwd|token|access_token|authorization|headers|"
    r"extra_headers|cookies?|credentials?)$|_(api_?key|secret|password|token)$",
    re.IGNORECASE,
)
_SECRET_ENV_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _looks_secret(env_name: str) -> bool:
    return _SECRET_ENV_NAME.search(env_name) is not None


def secret_values(env_names: Iterable[str] = ()) -> list[str]:
    """Values of secret-looking environment variables, plus those named in ``env_names``.
    Read from the environment on every call: a key set later is still blanked."""
    names = {name for name in os.environ if _looks_secret(name)} | set(env_names)
    values = {os.environ.get(name, "") for name in names}
    return sorted((v for v in values if len(v) >= 8), key=len, reverse=True)


# Provider endpoints and internal hosts in the error texts of workers and workflows: tenants
# get the reason without the address (the trace in the database and the logs keep it), in API
# answers and in webhook bodies alike.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)]")
_ADDRESS = re.compile(
    r"\b(?:\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?|(?=[\w.-]*[A-Za-z])[\w-]+(?:\.[\w-]+)*:\d{2,5})\b"
)
HIDDEN_ADDRESS = "[internal address]"


def without_addresses(text: str) -> str:
    """``text`` with every URL, IP address and host:port replaced by a placeholder."""
    return _ADDRESS.sub(HIDDEN_ADDRESS, _URL.sub(HIDDEN_ADDRESS, text))


def redact_text(text: str | None, secrets: list[str]) -> str | None:
    if text is None:
        return None
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def redact_strings(value: Any, secrets: list[str]) -> Any:
    """``value`` (JSON-like) with every secret blanked in every string it holds.

    Walked only when a secret occurs in it: one search of its JSON text (in C) instead of a
    Python walk of every string of every event (a workflow's outcome event holds the whole
    workflow). A secret occurs in a string exactly when its JSON-escaped form occurs in the
    text."""
    if not secrets:
        return value
    text = json.dumps(value, ensure_ascii=False, default=str)
    if not any(json.dumps(s, ensure_ascii=False)[1:-1] in text for s in secrets):
        return value
    return _redact_walk(value, secrets)


def _redact_walk(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: _redact_walk(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_walk(v, secrets) for v in value]
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


def scrub_snapshot(snapshot: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop credential fields and blank out any key value, wherever it hides (URL, text)."""
    env_names = {
        value
        for worker in snapshot
        for key, value in worker.items()
        if key.endswith("_env") and isinstance(value, str)
    }
    secrets = secret_values(env_names)

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items() if not _SECRET_KEY.search(str(k))}
        if isinstance(value, list | tuple):
            return [scrub(v) for v in value]
        return _redact_walk(value, secrets)

    return [scrub(worker) for worker in snapshot]
