"""The worker pool: which LLMs the Conductor may call, how to reach them and what they cost.

A pool comes from a YAML file (``CONDUCTOR_POOL_FILE``) or, by default, from what this machine
has: the local llama.cpp worker plus each cloud provider whose API key variable is set.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from conductor.chat import Usage
from conductor.errors import ConfigurationError, validation_problems
from conductor.yaml_files import load_yaml_file

LOCAL_WORKER_NAME = "smollm2-local"
BUILTIN_SMOLLM2 = "builtin:smollm2"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class Provider(StrEnum):
    LLAMACPP = "llamacpp"  # embedded llama.cpp engine, a GGUF file on this machine
    OPENAI = "openai"  # api.openai.com Chat Completions
    OPENAI_COMPATIBLE = "openai-compatible"  # vLLM, llama.cpp server, others
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"
    # A simulator, not an LLM: answers evaluation items right with per-domain probabilities
    # (conductor_evaluation.sim). For evaluating and training orchestration at zero cost.
    SIM = "sim"
    # Recorded answers of real LLMs, not calls: answers evaluation items of an outcome table
    # with what the worker answered then, at its recorded cost (conductor_evaluation.replay).
    REPLAY = "replay"


# Providers whose workers take tools (function calling) on a direct call: their adapters carry
# tools, calls and results in the vendor's own wire format. The embedded llama.cpp engine has
# no tool calling; a simulator or a replay answers evaluation items only.
TOOL_CALLING_PROVIDERS = frozenset(
    {Provider.OPENAI, Provider.OPENAI_COMPATIBLE, Provider.ANTHROPIC, Provider.GEMINI}
)

# Providers whose workers are sent images on a direct call (whether the model itself sees
# them is the model's: a text-only one refuses them with its provider's 400).
IMAGE_PROVIDERS = frozenset(
    {Provider.OPENAI, Provider.OPENAI_COMPATIBLE, Provider.ANTHROPIC, Provider.GEMINI}
)

# Cloud APIs that refuse calls without a key (self-hosted look-alikes may need none).
KEYED_PROVIDERS = frozenset({Provider.OPENAI, Provider.ANTHROPIC, Provider.GEMINI})

DEFAULT_BASE_URLS: Mapping[Provider, str] = {
    Provider.OPENAI: "https://api.openai.com/v1",
    Provider.ANTHROPIC: "https://api.anthropic.com",
    Provider.GEMINI: "https://generativelanguage.googleapis.com",
}


class Domain(StrEnum):
    """What kind of skill a question asks for; a simulated worker's skills are given per domain."""

    MATH = "math"
    KNOWLEDGE = "knowledge"
    CODE = "code"
    REASONING = "reasoning"
    GENERAL = "general"


class Price(BaseModel):
    """USD per million tokens."""

    # Strict: a quoted number or true/false in a pool file is a mistake to report, not to coerce.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    input: float = Field(default=0.0, ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    output: float = Field(default=0.0, ge=0)

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (
            (usage.prompt_tokens - cached) * self.input
            + cached * cached_rate
            + usage.completion_tokens * self.output
        ) / 1_000_000


class Quotas(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)


class SimProfile(BaseModel):
    """How a simulated worker behaves: skill per domain, check gain, cost and latency shape.

    The chance of a right answer follows an item-response curve: ``skill`` is the chance on an
    item of average difficulty (0.5), and it falls on harder items and rises on easier ones,
    ``logit(p) = logit(skill) - difficulty_slope * (difficulty - 0.5)``. A weak worker is then
    often right on easy items and rarely on hard ones, while a strong one stays ahead on both.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Probability of a right answer per item domain on an item of average difficulty; domains
    # not listed use ``default``.
    skills: dict[Domain, float] = Field(default_factory=dict)
    default: float = Field(default=0.5, ge=0, le=1)
    # How much an item's difficulty (0 easiest .. 1 hardest) moves the chance, in log-odds
    # from the easiest to the hardest item; 0: difficulty does not matter.
    difficulty_slope: float = Field(default=4.0, ge=0)
    # A step that sees an earlier right answer and is asked to check it is right with
    # probability p + check_gain * (1 - p).
    check_gain: float = Field(default=0.5, ge=0, le=1)
    output_tokens: int = Field(default=200, gt=0)  # mean answer length (sampled +-20%)
    latency_s: float = Field(default=0.02, ge=0)  # per call, plus per output token below
    latency_per_token_s: float = Field(default=0.0, ge=0)

    @field_validator("skills")
    @classmethod
    def _check_skills(cls, value: dict[Domain, float]) -> dict[Domain, float]:
        bad = [f"{d.value}={p}" for d, p in value.items() if not 0 <= p <= 1]
        if bad:
            raise ValueError(f"skills are probabilities in [0, 1]: {', '.join(bad)}")
        return value

    def skill(self, domain: Domain) -> float:
        return self.skills.get(domain, self.default)

    def chance(self, domain: Domain, difficulty: float | None) -> float:
        """The chance of a right answer on an item of ``domain`` and ``difficulty`` (None: of
        average difficulty). A skill of 0 or 1 stays so: a worker that is always right or
        always wrong is so on every item."""
        p = self.skill(domain)
        if difficulty is None or p in (0.0, 1.0):
            return p
        log_odds = math.log(p / (1 - p)) - self.difficulty_slope * (difficulty - 0.5)
        return 1 / (1 + math.exp(-log_odds))


class WorkerSpec(BaseModel):
    """One worker LLM. Holds the *name* of its API key variable, never the key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    provider: Provider
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    description: str = ""
    price: Price = Price()
    quotas: Quotas = Quotas()
    # Strict numbers and flags (the provider, an enum, is read from its string).
    max_tokens: int = Field(default=1024, gt=0, strict=True)
    temperature: float = Field(default=0.2, ge=0, le=2, strict=True)
    timeout_s: float = Field(default=120.0, gt=0, strict=True)
    # Workers tried, in order, when this one's retries are exhausted (or its key is refused).
    fallbacks: tuple[str, ...] = ()
    # Stream the answer from the provider (long answers never sit behind an idle timeout).
    stream: bool = Field(default=False, strict=True)
    # Provider ``sim`` only: how the simulated worker answers.
    sim: SimProfile | None = None
    # Provider ``replay`` only: the outcome table (a path) whose recorded answers of ``model``
    # the worker gives.
    table: str | None = Field(default=None, min_length=1)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "worker names are 1-64 characters of a-z, 0-9, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _check_provider_sections(self) -> WorkerSpec:
        if self.provider is Provider.SIM and self.sim is None:
            raise ValueError("provider 'sim' needs a 'sim' section (skills, check_gain, ...)")
        if self.provider is not Provider.SIM and self.sim is not None:
            raise ValueError("a 'sim' section belongs to provider 'sim' workers only")
        if self.provider is Provider.REPLAY and self.table is None:
            raise ValueError("provider 'replay' needs 'table' (the path of an outcome table)")
        if self.provider is not Provider.REPLAY and self.table is not None:
            raise ValueError("'table' belongs to provider 'replay' workers only")
        return self

    @property
    def simulated(self) -> bool:
        return self.provider is Provider.SIM

    @property
    def replayed(self) -> bool:
        return self.provider is Provider.REPLAY

    def resolved_base_url(self) -> str | None:
        return self.base_url or DEFAULT_BASE_URLS.get(self.provider)

    def availability(self, environ: Mapping[str, str] | None = None) -> str | None:
        """None when the worker can be called here, else the reason it cannot."""
        env = os.environ if environ is None else environ
        if self.provider is Provider.OPENAI_COMPATIBLE and not self.base_url:
            return "provider 'openai-compatible' needs base_url"
        if self.provider in KEYED_PROVIDERS and not self.api_key_env:
            return (
                f"provider {self.provider.value!r} needs api_key_env (the name of its key variable)"
            )
        if self.api_key_env and not env.get(self.api_key_env):
            return f"environment variable {self.api_key_env} is not set"
        return None

    def snapshot(self) -> dict[str, Any]:
        """What a trace keeps of this worker: everything but secrets (there are none here)."""
        return self.model_dump(mode="json")


class Pool(BaseModel):
    model_config = ConfigDict(frozen=True)

    workers: tuple[WorkerSpec, ...]

    @model_validator(mode="after")
    def _check_fallbacks(self) -> Pool:
        names = {w.name for w in self.workers}
        for worker in self.workers:
            unknown = [f for f in worker.fallbacks if f not in names]
            if unknown:
                raise ValueError(
                    f"worker {worker.name!r}: fallbacks {', '.join(map(repr, unknown))} "
                    "are not in the pool"
                )
            if worker.name in worker.fallbacks:
                raise ValueError(f"worker {worker.name!r} names itself as a fallback")
        return self

    def find(self, name: str) -> WorkerSpec | None:
        return next((worker for worker in self.workers if worker.name == name), None)

    @property
    def tool_workers(self) -> list[str]:
        """The workers whose wire format carries tools, in pool order."""
        return [w.name for w in self.workers if w.provider in TOOL_CALLING_PROVIDERS]

    def get(self, name: str) -> WorkerSpec:
        worker = self.find(name)
        if worker is not None:
            return worker
        known = ", ".join(w.name for w in self.workers) or "none"
        raise ConfigurationError(f"no worker named {name!r} in the pool (known: {known})")

    def available(self, environ: Mapping[str, str] | None = None) -> list[WorkerSpec]:
        return [w for w in self.workers if w.availability(environ) is None]

    def unavailable(self, environ: Mapping[str, str] | None = None) -> list[tuple[WorkerSpec, str]]:
        out = []
        for worker in self.workers:
            reason = worker.availability(environ)
            if reason is not None:
                out.append((worker, reason))
        return out


def local_worker(model: str = BUILTIN_SMOLLM2) -> WorkerSpec:
    return WorkerSpec(
        name=LOCAL_WORKER_NAME,
        provider=Provider.LLAMACPP,
        model=model,
        description=(
            "A tiny 135M-parameter instruction model running locally on the CPU. Fast and free, "
            "but weak: use it for short, simple subtasks."
        ),
        # Its useful answers are short (under 170 tokens in our samples); longer ones are loops
        # that repeat a sentence, at about 14 ms a token on 2 cores.
        max_tokens=192,
    )


# Cloud workers added to the default pool when their key variable is set.
_DEFAULT_CLOUD_WORKERS = (
    WorkerSpec(
        name="openai",
        provider=Provider.OPENAI,
        model="gpt-4.1-mini",
        api_key_env="OPENAI_API_KEY",
        description="OpenAI GPT-4.1 mini: strong general reasoning, coding and writing.",
        price=Price(input=0.40, cached_input=0.10, output=1.60),
    ),
    WorkerSpec(
        name="anthropic",
        provider=Provider.ANTHROPIC,
        model="claude-sonnet-4-5",
        api_key_env="ANTHROPIC_API_KEY",
        description="Anthropic Claude Sonnet: careful reasoning, long context, strong coding.",
        price=Price(input=3.0, cached_input=0.30, output=15.0),
    ),
    WorkerSpec(
        name="gemini",
        provider=Provider.GEMINI,
        model="gemini-2.5-flash",
        api_key_env="GEMINI_API_KEY",
        description="Google Gemini 2.5 Flash: fast, broad knowledge, good at math.",
        price=Price(input=0.30, cached_input=0.075, output=2.50),
    ),
)


def default_pool(
    environ: Mapping[str, str] | None = None, local_model: str = BUILTIN_SMOLLM2
) -> Pool:
    env = os.environ if environ is None else environ
    cloud = [w for w in _DEFAULT_CLOUD_WORKERS if w.api_key_env and env.get(w.api_key_env)]
    return Pool(workers=(local_worker(local_model), *cloud))


def parse_pool(data: Any, source: str = "pool file") -> Pool:
    """Build a pool from the YAML structure ``workers: {name: {provider: ..., ...}}``."""
    if not isinstance(data, dict) or not isinstance(data.get("workers"), dict | list):
        raise ConfigurationError(f"{source}: expected a mapping with a 'workers' section")
    raw = data["workers"]
    named = raw.items() if isinstance(raw, dict) else ((f"#{i + 1}", s) for i, s in enumerate(raw))
    items: list[Any] = []
    for label, spec in named:
        if isinstance(raw, dict) and spec is None:
            spec = {}  # a worker given by name alone: its settings are checked below
        if not isinstance(spec, dict):
            raise ConfigurationError(
                f"{source}: worker {label!r}: expected a mapping of settings (provider, model, "
                f"...), got {type(spec).__name__} {spec!r:.80}"
            )
        items.append({"name": label, **spec} if isinstance(raw, dict) else spec)
    workers = []
    for item in items:
        try:
            workers.append(WorkerSpec.model_validate(item))
        except ValidationError as exc:
            name = item.get("name", "?") if isinstance(item, dict) else "?"
            raise ConfigurationError(
                f"{source}: worker {name!r}: {validation_problems(exc, whole='value')}"
            ) from exc
    names = [w.name for w in workers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(f"{source}: duplicate worker names: {', '.join(duplicates)}")
    if not workers:
        raise ConfigurationError(f"{source}: the pool has no workers")
    try:
        return Pool(workers=tuple(workers))
    except ValidationError as exc:
        raise ConfigurationError(f"{source}: {validation_problems(exc, whole='value')}") from exc


def load_pool_file(path: Path) -> Pool:
    return parse_pool(load_yaml_file(path, "pool file"), source=str(path))
