"""Where a pool worker is reached and with which key, and the base every HTTP adapter shares."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import httpx

from conductor.errors import ConfigurationError, WorkerUnavailable
from conductor.pool import KEYED_PROVIDERS, Provider, WorkerSpec
from conductor_adapters.http_wire import new_client


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


class HttpWorker:
    """What every HTTP adapter shares: identity, deadline, error label, HTTP client, from_spec.

    Subclasses name the providers they speak and set up their URL and headers in ``configure``;
    each makes exactly one HTTP call per ``complete`` or ``stream``.
    """

    providers: ClassVar[frozenset[Provider]]
    wire_format: ClassVar[str]
    url: str

    def __init__(
        self,
        *,
        name: str,
        model: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.timeout_s = timeout_s
        self.provider = f"worker {name!r}"  # how error messages name this worker
        self._owns_client = client is None
        self._client = client if client is not None else new_client()
        self.configure(base_url.rstrip("/"), api_key)

    def configure(self, base_url: str, api_key: str | None) -> None:
        raise NotImplementedError

    @classmethod
    def spec_options(cls, spec: WorkerSpec) -> dict[str, Any]:
        """Extra constructor arguments a subclass reads from the pool entry."""
        return {}

    @classmethod
    def from_spec(
        cls,
        spec: WorkerSpec,
        environ: Mapping[str, str] = os.environ,
        client: httpx.AsyncClient | None = None,
    ) -> Self:
        if spec.provider not in cls.providers:
            raise ConfigurationError(
                f"worker {spec.name!r}: provider {spec.provider.value!r} does not speak the "
                f"{cls.wire_format}"
            )
        endpoint = resolve_endpoint(spec, environ)
        return cls(
            name=spec.name,
            model=spec.model,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            timeout_s=spec.timeout_s,
            client=client,
            **cls.spec_options(spec),
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this worker created it; a borrowed one is its owner's."""
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, url={self.url!r})"
