"""The rules a request to start work is checked against, whatever door it came in by: who is
calling, the variant and its settings, the labels, and the workers it may use (the pool and
its key's). Errors name the field at fault as the door calls it (``SubmitFields``)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conductor.answer_format import AnswerFormat
from conductor.chat import ToolUse
from conductor.errors import InvalidRequest
from conductor.orchestration import check_question, check_text
from conductor.tracing import current_traceparent
from conductor.variants import MAX_STEPS_LIMIT, Variant, get_variant
from conductor_adapters.store.keys import KeyLimits
from conductor_adapters.store.runs import SubmitRequest
from conductor_api.schemas import MAX_LABEL_VALUE_CHARS, MAX_LABELS, MAX_NAME_CHARS
from conductor_api.tools import TOOL_WORKERS


@dataclass(frozen=True)
class Caller:
    """Who is calling: the API key's tenant and the workers it may use (None: any)."""

    tenant: str
    allowed_pool: tuple[str, ...] | None = None
    key_id: str | None = None
    limits: KeyLimits | None = None
    signs_webhooks: bool = False  # its key has a webhook signing secret


@dataclass(frozen=True)
class SubmitFields:
    """What a front end calls each part of a submission, for the errors that name it."""

    question: str = "question"
    variant: str = "variant"
    pool: str = "pool"
    max_steps: str = "max_steps"
    cost_weight: str = "cost_weight"
    labels: str = "metadata"


# The job API's and gRPC's names; chat completions carry the options under "conductor".
JOB_FIELDS = SubmitFields()
CHAT_FIELDS = SubmitFields(
    question="messages",
    variant="model",
    pool="conductor.pool",
    max_steps="conductor.max_steps",
    cost_weight="conductor.cost_weight",
)


def check_labels(labels: Mapping[str, str], field: str) -> None:
    """The HTTP schemas' limits on labels, for every front end (gRPC's arrive unchecked)."""
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(
            f"{field}: at most {MAX_LABELS} labels, not {len(labels)}", param=field
        )
    for key, value in labels.items():
        if not 1 <= len(key) <= MAX_NAME_CHARS:
            raise InvalidRequest(
                f"{field}: a label's name has 1 to {MAX_NAME_CHARS} characters, not {len(key)}",
                param=field,
            )
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise InvalidRequest(
                f"{field}: the label {key!r} is longer than {MAX_LABEL_VALUE_CHARS} characters",
                param=field,
            )
        try:
            check_text(f"the label {key!r}", key + value)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{field}: {exc}", param=field) from None


def request_hash(
    question: str,
    variant: str | None,
    pool: Sequence[str] | None,
    max_steps: int | None,
    cost_weight: float | None,
    metadata: Mapping[str, str] | None,
    callback_url: str | None,
    answer_format: AnswerFormat | None,
    tools: ToolUse | None = None,
) -> str:
    """The SHA-256 an Idempotency-Key is kept with: of the request as asked (the job API's
    body, hashed as it always was), not as checked, so a retry after the pool or a variant
    changed is still the same request."""
    asked: dict[str, object] = {
        "question": question,
        "variant": variant,
        "pool": None if pool is None else list(pool),
        "max_steps": max_steps,
        "cost_weight": cost_weight,
        "metadata": dict(metadata or {}),
        "callback_url": callback_url,
    }
    if answer_format is not None:
        asked["answer_format"] = answer_format.model_dump(mode="json")
    if tools is not None:
        asked["tools"] = tools.model_dump(mode="json")
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def check_filter(labels: Mapping[str, str], variant: str) -> None:
    """The HTTP filters' limits on a listing's labels and variant, for gRPC's (which arrive
    unchecked): a NUL, which PostgreSQL refuses in a bound value, and lengths past any
    variant's or label's."""
    check_labels(labels, "labels")
    if len(variant) > MAX_NAME_CHARS:
        raise InvalidRequest(f"variant: longer than {MAX_NAME_CHARS} characters", param="variant")
    check_text("variant:", variant, param="variant")


class Rules:
    """The checks of a submission against a pool (its workers' names, in order) and the
    variants (``default_variant`` when a request names none)."""

    def __init__(
        self,
        worker_names: Sequence[str],
        variants: Mapping[str, Variant],
        default_variant: str,
        tool_workers: Sequence[str] = (),
    ) -> None:
        self.worker_names = list(worker_names)
        self.variants = dict(variants)
        self.default_variant = default_variant
        # Workers whose wire format carries tools: a workflow offered tools needs one.
        self.tool_workers = [n for n in self.worker_names if n in set(tool_workers)]

    def variant_for(
        self,
        name: str | None,
        max_steps: int | None,
        cost_weight: float | None = None,
        fields: SubmitFields = JOB_FIELDS,
    ) -> Variant:
        """The variant a request names (the default when it names none), with its max_steps
        and router cost weight. Checked here, not only by the HTTP schemas: gRPC requests
        arrive unvalidated."""
        try:
            variant = get_variant(name or self.default_variant, self.variants)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{fields.variant}: {exc}", param=fields.variant) from None
        if max_steps is not None:
            if not 1 <= max_steps <= MAX_STEPS_LIMIT:
                raise InvalidRequest(
                    f"{fields.max_steps} must be 1 to {MAX_STEPS_LIMIT}, not {max_steps}",
                    param=fields.max_steps,
                )
            variant = variant.model_copy(update={"max_steps": max_steps})
        if cost_weight is not None:
            if not math.isfinite(cost_weight) or cost_weight < 0:
                raise InvalidRequest(
                    f"{fields.cost_weight} must be a number >= 0, not {cost_weight}",
                    param=fields.cost_weight,
                )
            variant = variant.model_copy(update={"router_cost_weight": cost_weight})
        return variant

    def allowed_workers(self, caller: Caller) -> list[str]:
        """The workers of the pool the caller's key may use, in pool order."""
        if caller.allowed_pool is None:
            return list(self.worker_names)
        return [n for n in self.worker_names if n in caller.allowed_pool]

    def resolve_pool(
        self, caller: Caller, requested: Sequence[str] | None, fields: SubmitFields = JOB_FIELDS
    ) -> list[str] | None:
        """The workers a request may use: what it asked for, checked against the pool and the
        caller's key; None means every worker of the pool (a key without limits)."""
        if requested is None:
            return None if caller.allowed_pool is None else list(caller.allowed_pool)
        wanted = list(dict.fromkeys(requested))
        if caller.allowed_pool is not None:
            # One answer whether a name is in the pool or not: a key limited to some workers
            # learns nothing of the others, not even which names exist.
            allowed = self.allowed_workers(caller)
            refused = [n for n in wanted if n not in allowed]
            if refused:
                raise InvalidRequest(
                    f"{fields.pool}: this API key may not use {', '.join(refused)} "
                    f"(allowed: {', '.join(allowed) or 'none'})",
                    param=fields.pool,
                )
            return wanted
        unknown = [n for n in wanted if n not in self.worker_names]
        if unknown:
            raise InvalidRequest(
                f"{fields.pool}: workers not in the pool: {', '.join(unknown)} "
                f"(known: {', '.join(self.worker_names)})",
                param=fields.pool,
            )
        return wanted

    def submission(
        self,
        caller: Caller,
        question: str,
        *,
        variant: str | None = None,
        pool: Sequence[str] | None = None,
        max_steps: int | None = None,
        cost_weight: float | None = None,
        metadata: Mapping[str, str] | None = None,
        fields: SubmitFields = JOB_FIELDS,
        answer_format: AnswerFormat | None = None,
        tools: ToolUse | None = None,
    ) -> SubmitRequest:
        """A request checked against every rule before anything is recorded: the question,
        the variant, max_steps, the labels, and the pool against the pool and the caller's
        key. Errors name the field at fault as ``fields`` calls it. ``answer_format`` comes
        checked by the front end that read it (its schema is one)."""
        try:
            check_question(question)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{fields.question}: {exc}", param=fields.question) from None
        labels = dict(metadata or {})
        check_labels(labels, fields.labels)
        resolved = self.resolve_pool(caller, pool, fields)
        if tools is not None and tools.choice == "none":
            tools = None  # nothing may be called: the workflow runs as without tools
        if tools is not None:
            self._check_tool_workers(resolved)
        return SubmitRequest(
            question=question,
            variant=self.variant_for(variant, max_steps, cost_weight, fields),
            pool=resolved,
            tenant=caller.tenant,
            metadata=labels,
            answer_format=answer_format,
            tools=tools,
            key_id=caller.key_id,
            # The request's span (a door's server span) is its workflow's parent.
            trace_parent=current_traceparent(),
        )

    def _check_tool_workers(self, pool: Sequence[str] | None) -> None:
        """A workflow offered tools runs its answering step on a worker whose wire format
        carries them: its pool must have one."""
        names = self.worker_names if pool is None else pool
        if not any(n in self.tool_workers for n in names):
            raise InvalidRequest(
                f"tools: no worker of this workflow's pool ({', '.join(names) or 'none'}) "
                f"takes tools; function calling goes to workers of providers {TOOL_WORKERS}",
                param="tools",
            )
