"""Settings from the environment (prefix ``CONDUCTOR_``). Build them in ``main()`` or through
``get_settings()``, never at import time, so tests and services choose their own."""

from __future__ import annotations

import os
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from conductor.errors import ConfigurationError
from conductor.pool import BUILTIN_SMOLLM2, Pool, default_pool, load_pool_file
from conductor.variants import BUILTIN_VARIANTS, Variant, load_variants_file


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "conductor"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conductor"


def file_cache_key(path: Path, *versions: str) -> str:
    """What a cache derived from a model file depends on: the file (its path, size and time of
    change) and the versions of the software that derived it."""
    stat = path.stat()
    return "|".join([str(path), str(stat.st_size), str(stat.st_mtime_ns), *versions])


def default_llamacpp_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'conductor.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUCTOR_", extra="ignore", populate_by_name=True
    )

    # Traces. The default is a SQLite file in the user's data directory.
    database_url: str = Field(default_factory=_default_database_url)
    # `conductor traces prune`: days a workflow is kept (a tenant may have its own, set with
    # `conductor traces retention set`). Unset: kept forever.
    trace_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    # Worker pool file (YAML). Unset: the local worker plus each cloud worker whose key is set.
    pool_file: Path | None = None
    # Operator-defined variants (YAML ``variants: {NAME: {max_steps, ...}}``), besides the
    # built-in conductor-mini and conductor-ultra; and the variant used when a request names none.
    variants_file: Path | None = Field(
        default=None,
        # CONDUCTOR_PROFILES_FILE: the name before variants had one word.
        validation_alias=AliasChoices("CONDUCTOR_VARIANTS_FILE", "CONDUCTOR_PROFILES_FILE"),
    )
    default_variant: str = "conductor-ultra"
    # GGUF model of the local worker and of the llamacpp planner: a path or builtin:smollm2.
    local_model: str = BUILTIN_SMOLLM2

    # Distributed mode: the planner service's gRPC address (host:port).
    planner_addr: str = "127.0.0.1:50051"

    planner_backend: Literal["llamacpp", "openai", "transformers", "vllm"] = "llamacpp"
    # llamacpp: a GGUF path (default: local_model). openai: the model name at planner_base_url.
    # transformers: a checkpoint directory (save_pretrained), a GGUF file or a hub id (default:
    # builtin:smollm2). vllm: a checkpoint directory or hub id (required).
    planner_model: str | None = None
    planner_base_url: str | None = None
    planner_api_key_env: str | None = None
    # openai and vllm: constrain the Conductor's output to the plan's JSON schema. Leave it off
    # for a trained checkpoint: training teaches the lists form, and serving must match it.
    planner_structured: bool = False
    # transformers: where the model runs (cuda, cuda:1, cpu). Unset: cuda if available, else cpu.
    planner_device: str | None = None
    # transformers and vllm: weights dtype. auto: bfloat16 on a GPU, float32 on CPU (vllm: its own
    # choice from the checkpoint).
    planner_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # transformers: concurrent plans (of one temperature) generated together in one batch.
    planner_max_batch_size: int = Field(default=8, ge=1)
    # vllm: share of GPU memory the engine may take (weights and KV cache), and the context
    # length it reserves KV cache for (unset: the model's own).
    planner_gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    planner_max_model_len: int | None = Field(default=None, ge=256)
    # A router file from `conductor router train`: one-step requests (conductor-mini) are routed
    # by it instead of planned by the language model. Unset: the language model plans them.
    router_model: str | None = None

    # Threads of each llama.cpp engine. Its threads spin at a barrier after every operation, so
    # when two engines (or other work) share the cores and the threads outnumber them, each
    # slows down many times over (measured on 2 cores: one ask alone 13 s, two at once 50 s with
    # 2 threads each, 21 s with 1 each). One engine per process: `conductor stack` gives each of
    # its engine processes its share of the cores.
    llamacpp_threads: int = Field(default_factory=default_llamacpp_threads, ge=1)
    llamacpp_context_tokens: int = Field(default=8192, ge=512)
    llamacpp_parallel_slots: int = Field(default=4, ge=1)
    # Keep the KV cache of the Conductor's system message in the user's cache directory, so a
    # new process's first plan does not recompute it (~26 MB per system message and model).
    llamacpp_prompt_cache: bool = True

    # conductor serve: how often it says it lives, and how long a silent one is taken for dead
    # (its queued and running workflows are then failed with a reason by a live one).
    runner_heartbeat_s: float = Field(default=5.0, gt=0)
    runner_stale_after_s: float = Field(default=30.0, gt=0)

    # conductor serve / api: origins a browser may call the HTTP API from (CORS), as a JSON
    # list, e.g. '["https://app.example.com"]'; ["*"] allows any. Empty: no CORS headers.
    cors_origins: list[str] = Field(default_factory=list)
    # conductor serve / api: Host names the HTTP API answers besides loopback ones, comma-
    # separated ("conductor.example.com,*.internal.example.com"; "*": any). Empty: an open
    # server (no API key yet) answers loopback names only, against DNS rebinding; a server
    # with keys answers any name.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        return tuple(h.strip().lower() for h in value.split(",") if h.strip())

    # Every server role (planner, aggregator, gateway, api, serve): serve /metrics, /healthz
    # and /readyz on this HTTP port (0: any free port). Unset: none, so several processes on
    # one machine never collide. The API's /metrics (every tenant's figures) is served there
    # alone once API keys exist: its own port stays for clients.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


class BrokerSettings(BaseSettings):
    """The queue and Redis every distributed role shares (gateway, aggregator, api)."""

    model_config = SettingsConfigDict(env_prefix="CONDUCTOR_", extra="ignore")

    # Celery broker (Redis or RabbitMQ). Unset: embedded mode, everything in-process.
    broker_url: str | None = None
    # Shared quotas, gateway replies to in-process callers and event notifications.
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "conductor:"
    # Redis broker only: a task unacknowledged this long is handed to another consumer. Must
    # exceed the longest task (a provider call with its retries and quota waits), or tasks run
    # twice; it is also how long a killed process's tasks wait before redelivery.
    broker_visibility_timeout_s: int = Field(default=3600, ge=10)


class WebhookSettings(BaseSettings):
    """What webhooks may reach: read by every process that checks or sends them (the API,
    the aggregators, `conductor keys webhook`)."""

    model_config = SettingsConfigDict(env_prefix="CONDUCTOR_", extra="ignore")

    # Networks webhooks may reach although they are not public (loopback, private, link-local,
    # ...), as comma-separated CIDRs, e.g. "10.8.0.0/16,fd00:8::/32" for receivers inside the
    # cluster. Empty: public addresses only, so a key holder cannot aim the service inside.
    webhook_allowed_networks: Annotated[tuple[IPv4Network | IPv6Network, ...], NoDecode] = ()

    @field_validator("webhook_allowed_networks", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        networks = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                networks.append(ip_network(part))
            except ValueError as exc:  # names the part at fault: "... has host bits set"
                raise ValueError(f"{part!r} is not a network in CIDR form: {exc}") from None
        return tuple(networks)


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings; a bad variable is a ConfigurationError that names it."""
    return load_settings(Settings)


def load_settings(cls: type[SettingsT]) -> SettingsT:
    """Build a ``CONDUCTOR_*`` settings class; a bad variable is a ConfigurationError naming it."""
    try:
        return cls()
    except ValidationError as exc:
        problems = "; ".join(
            f"CONDUCTOR_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid setting: {problems}") from None


def load_variants(settings: Settings) -> dict[str, Variant]:
    """Built-in variants, then the operator's (which may replace a built-in one)."""
    variants = dict(BUILTIN_VARIANTS)
    if settings.variants_file is not None:
        variants.update(load_variants_file(settings.variants_file))
    if settings.default_variant not in variants:
        raise ConfigurationError(
            f"invalid setting: CONDUCTOR_DEFAULT_VARIANT {settings.default_variant!r} is not a "
            f"variant (known: {', '.join(sorted(variants))})"
        )
    return variants


def load_pool(settings: Settings) -> Pool:
    """The pool every service uses: the pool file if one is set, else the default pool."""
    if settings.pool_file is not None:
        return load_pool_file(settings.pool_file)
    return default_pool(local_model=settings.local_model)
