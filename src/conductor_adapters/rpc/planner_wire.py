"""Conversions between the planner's pydantic models and its ``conductor.v1`` messages.

Lossless for everything the pydantic models carry: ``x_from_proto(x_to_proto(v)) == v``. What the
wire has and the models lack is derived (``Usage.total_tokens``, ``PriorRound.unanswered``).
Messages that the models cannot hold (an empty access entry, an unanswered index outside the
plan, negative token counts) raise InvalidRequest, so a server can answer INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError

from conductor.chat import Usage
from conductor.errors import InvalidRequest, validation_problems
from conductor.ports import PlanRequest, PriorRound
from conductor.workflow import ALL, AccessEntry, Plan, PlanOutcome, PlanStep, PoolEntry
from conductor_adapters.rpc.v1 import common_pb2, planner_pb2

ModelT = TypeVar("ModelT")

# The pydantic defaults that an unset optional field (temperature, max_tokens) stands for.
_DEFAULTS = PlanRequest(question="", pool=[], max_steps=1)


def usage_to_proto(usage: Usage) -> Any:
    return common_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
    )


def usage_from_proto(message: Any) -> Usage:
    """total_tokens is not read: the model derives it from its parts."""
    return _build(
        Usage,
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.completion_tokens,
        cached_tokens=message.cached_tokens,
        reasoning_tokens=message.reasoning_tokens,
    )


def pool_entry_to_proto(entry: PoolEntry) -> Any:
    return common_pb2.PoolEntry(
        name=entry.name, description=entry.description, is_conductor=entry.is_conductor
    )


def pool_entry_from_proto(message: Any) -> PoolEntry:
    return PoolEntry(
        name=message.name, description=message.description, is_conductor=message.is_conductor
    )


def access_to_proto(entry: AccessEntry) -> Any:
    if entry == ALL:
        return common_pb2.AccessEntry(all=True)
    return common_pb2.AccessEntry(step=entry)


def access_from_proto(message: Any) -> AccessEntry:
    kind = message.WhichOneof("entry")
    if kind == "all" and message.all:
        return ALL
    if kind == "step":
        step: int = message.step
        return step
    raise InvalidRequest("an access-list entry must set either all=true or step")


def plan_to_proto(plan: Plan) -> Any:
    return common_pb2.Plan(
        steps=[
            common_pb2.PlanStep(
                model_id=step.model_id,
                subtask=step.subtask,
                access_list=[access_to_proto(entry) for entry in step.access_list],
            )
            for step in plan.steps
        ]
    )


def plan_from_proto(message: Any) -> Plan:
    return Plan(
        steps=tuple(
            PlanStep(
                model_id=step.model_id,
                subtask=step.subtask,
                access_list=tuple(access_from_proto(entry) for entry in step.access_list),
            )
            for step in message.steps
        )
    )


def prior_to_proto(prior: PriorRound) -> Any:
    """A missing answer (None) goes on the wire as "" with its index in ``unanswered``."""
    return planner_pb2.PriorRound(
        plan=plan_to_proto(prior.plan),
        answers=["" if answer is None else answer for answer in prior.answers],
        last_answer=prior.last_answer,
        unanswered=[i for i, answer in enumerate(prior.answers) if answer is None],
    )


def prior_from_proto(message: Any) -> PriorRound:
    answers: list[str | None] = list(message.answers)
    for index in message.unanswered:
        if not 0 <= index < len(answers):
            raise InvalidRequest(
                f"prior.unanswered has index {index}, but prior.answers has {len(answers)} entries"
            )
        answers[index] = None
    return PriorRound(
        plan=plan_from_proto(message.plan), answers=answers, last_answer=message.last_answer
    )


def request_to_proto(request: PlanRequest) -> Any:
    return planner_pb2.PlanRequest(
        question=request.question,
        pool=[pool_entry_to_proto(entry) for entry in request.pool],
        max_steps=request.max_steps,
        round=request.round,
        prior=None if request.prior is None else prior_to_proto(request.prior),
        temperature=request.temperature,
        max_tokens=request.max_tokens,
        fallback_model_id=request.fallback_model_id,
        workflow_max_steps=request.workflow_max_steps or 0,
        cost_weight=request.cost_weight,
    )


def request_from_proto(message: Any) -> PlanRequest:
    """Unset temperature and max_tokens take the pydantic defaults."""
    return _build(
        PlanRequest,
        question=message.question,
        pool=[pool_entry_from_proto(entry) for entry in message.pool],
        max_steps=message.max_steps,
        workflow_max_steps=message.workflow_max_steps or None,
        round=message.round,
        prior=prior_from_proto(message.prior) if message.HasField("prior") else None,
        temperature=(
            message.temperature if message.HasField("temperature") else _DEFAULTS.temperature
        ),
        max_tokens=message.max_tokens if message.HasField("max_tokens") else _DEFAULTS.max_tokens,
        fallback_model_id=message.fallback_model_id,
        cost_weight=message.cost_weight if message.HasField("cost_weight") else None,
    )


def outcome_to_proto(outcome: PlanOutcome) -> Any:
    return common_pb2.PlannerCall(
        round=outcome.round,
        raw_output=outcome.raw_output,
        valid=outcome.valid,
        errors=outcome.errors,
        plan=plan_to_proto(outcome.plan),
        stop=outcome.stop,
        pool=[pool_entry_to_proto(entry) for entry in outcome.pool],
        usage=usage_to_proto(outcome.usage),
        cost_usd=outcome.cost_usd,
        latency_ms=outcome.latency_ms,
        backend=outcome.backend,
    )


def outcome_from_proto(message: Any) -> PlanOutcome:
    return _build(
        PlanOutcome,
        round=message.round,
        raw_output=message.raw_output,
        valid=message.valid,
        errors=list(message.errors),
        plan=plan_from_proto(message.plan),
        stop=message.stop,
        pool=[pool_entry_from_proto(entry) for entry in message.pool],
        usage=usage_from_proto(message.usage),
        cost_usd=message.cost_usd,
        latency_ms=message.latency_ms,
        backend=message.backend,
    )


def _build(model: type[ModelT], **fields: Any) -> ModelT:
    """``model(**fields)``, with a rejected value reported as InvalidRequest."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {model.__name__}: {validation_problems(exc)}") from None
