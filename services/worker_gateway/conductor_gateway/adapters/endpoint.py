"""Where a pool worker is reached and with which key: the checks every HTTP adapter shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from conductor.errors import ConfigurationError, WorkerUnavailable
from conductor.pool import KEYED_PROVIDERS, WorkerSpec


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None

    def __repr__(self) -> str:  # never the key
        return f"Endpoint(base_url={self.base_url!r})"


def resolve_endpoint(spec: WorkerSpec, environ: Mapping[str, str]) -> Endpoint:
    """The worker's base URL and key; the key is read from the variable it names, here only."""
    base_url = spec.resolved_base_url()
    if not base_url:
        raise ConfigurationError(f"worker {spec.name!r}: set base_url in the pool file")
    if httpx.URL(base_url).scheme not in ("http", "https"):
        raise ConfigurationError(
            f"worker {spec.name!r}: base_url {base_url!r} must start with http:// or https://"
        )
    api_key: str | None = None
    if spec.api_key_env:
        api_key = environ.get(spec.api_key_env) or None
        if api_key is None:
            raise WorkerUnavailable(
                f"worker {spec.name!r}: environment variable {spec.api_key_env} is not set"
            )
    elif spec.provider in KEYED_PROVIDERS:
        raise WorkerUnavailable(
            f"worker {spec.name!r}: provider {spec.provider.value!r} needs api_key_env "
            "in the pool file"
        )
    return Endpoint(base_url=base_url.rstrip("/"), api_key=api_key)
