"""The Conductor planner: prompt -> backend -> tolerant parse -> strict validation -> fallback.

Backends only generate text; everything that makes a plan trustworthy happens here, the same
for every backend. Invalid output never reaches the executor: it is recorded as invalid and
replaced by a one-step fallback plan (or, in a recursion round, by stopping).

With a learned router, a one-step request (conductor-mini) is routed instead: the router picks
the worker among those the request allows, the question as asked is its subtask, and the
decision with every worker's scores is what the trace records as this Conductor call's output.
A router that cannot decide (it knows none of the allowed workers) leaves the request to the
language model, and the call's backend says why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.chat import Usage
from conductor.errors import ConfigurationError
from conductor.pool import Price
from conductor.ports import PlanFormat, PlannerBackend, PlanRequest
from conductor.protocol import (
    ParseFailure,
    fallback_plan,
    parse_plan,
    plan_schema,
    render_prompt,
    text_limits,
    validate_plan,
)
from conductor.tracing import end_provider_call, model_call_span
from conductor.workflow import Plan, PlanOutcome, PlanStep
from conductor_adapters.settings import Settings

if TYPE_CHECKING:  # the router needs the router extra (numpy, WordLlama): loaded only when set
    from conductor_router import Router

ROUTER_BACKEND = "router"


def load_router(settings: Settings) -> Router | None:
    """The router ``CONDUCTOR_ROUTER_MODEL`` names, loaded now: a bad file stops the start with
    the reason rather than failing requests later. None when none is configured."""
    if not settings.router_model:
        return None
    try:
        from conductor_router import Router
    except ImportError as exc:
        raise ConfigurationError(
            f"CONDUCTOR_ROUTER_MODEL needs the router's packages ({exc.name} is missing): "
            "pip install 'conductor[router]'"
        ) from exc
    return Router.load(Path(settings.router_model))


# gen_ai.provider.name of the Conductor's own calls (its backend names the model).
CONDUCTOR_PROVIDER = "conductor.planner"


class ConductorPlanner:
    def __init__(
        self, backend: PlannerBackend, *, price: Price | None = None, router: Router | None = None
    ) -> None:
        self.backend = backend
        self.price = price or Price()
        self.router = router

    async def plan(self, request: PlanRequest) -> PlanOutcome:
        if self.router is not None and request.max_steps == 1 and request.round == 0:
            routed = self._route(self.router, request)
            if isinstance(routed, PlanOutcome):
                return routed
            outcome = await self._generate(request)
            return outcome.model_copy(update={"backend": f"{outcome.backend} ({routed})"})
        return await self._generate(request)

    def _route(self, router: Router, request: PlanRequest) -> PlanOutcome | str:
        """The router's one-step plan, or why it could not decide."""
        started = time.perf_counter()
        ids = {entry.name: i for i, entry in enumerate(request.pool) if not entry.is_conductor}
        decision = router.choose(
            request.question, allowed=ids.keys(), cost_weight=request.cost_weight
        )
        if decision is None:
            return "the router knows none of the allowed workers: planned by the model"
        step = PlanStep(model_id=ids[decision.worker], subtask=request.question)
        return PlanOutcome(
            round=request.round,
            raw_output=json.dumps(decision.as_record(), sort_keys=True),
            valid=True,
            plan=Plan(steps=(step,)),
            pool=request.pool,
            usage=Usage(),
            latency_ms=(time.perf_counter() - started) * 1000,
            backend=ROUTER_BACKEND,
        )

    async def _generate(self, request: PlanRequest) -> PlanOutcome:
        conductor_ids = [i for i, entry in enumerate(request.pool) if entry.is_conductor]
        conductor_id = conductor_ids[0] if conductor_ids else None
        worker_ids = [i for i, entry in enumerate(request.pool) if not entry.is_conductor]
        if request.fallback_model_id not in worker_ids:
            raise ValueError(f"fallback model {request.fallback_model_id} is not a worker id")
        allow_stop = request.round > 0
        fmt = self.backend.plan_format
        form = self.backend.prompt_form
        schema = None
        if fmt is PlanFormat.JSON:
            reasoning_chars, subtask_chars = text_limits(
                request.max_tokens, request.max_steps, reasoning=form.reasoning
            )
            schema = plan_schema(
                worker_ids=worker_ids,
                max_steps=request.max_steps,
                conductor_id=conductor_id,
                allow_stop=allow_stop,
                max_subtask_chars=subtask_chars,
                max_reasoning_chars=reasoning_chars,
            )
        started = time.perf_counter()
        prompt = render_prompt(request, fmt, form=form)
        # The model where the backend names one (a served model's), else the backend.
        model = str(getattr(self.backend, "model", None) or self.backend.name)
        with model_call_span(
            CONDUCTOR_PROVIDER, model, prompt, request.max_tokens, request.temperature
        ) as span:
            try:
                completion = await self.backend.generate(
                    prompt,
                    json_schema=schema,
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                )
            except BaseException as exc:
                end_provider_call(span, None, exc)
                raise
            end_provider_call(span, completion)
        latency_ms = (time.perf_counter() - started) * 1000

        parsed = parse_plan(completion.text)
        plan: Plan | None = None
        stop = False
        if isinstance(parsed, ParseFailure):
            errors = [parsed.reason]
        else:
            validation = validate_plan(
                parsed,
                pool_size=len(request.pool),
                max_steps=request.max_steps,
                conductor_id=conductor_id,
                allow_stop=allow_stop,
                examples_shown=form.examples,
            )
            errors, plan, stop = validation.errors, validation.plan, validation.stop
        if errors:
            if completion.finish_reason == "length":
                errors.append(f"output cut at max_tokens={request.max_tokens}")
            # Round 0 must answer, so it falls back; a later round keeps the last answer.
            stop = allow_stop
            plan = None
        return PlanOutcome(
            round=request.round,
            raw_output=completion.text,
            valid=not errors,
            errors=errors,
            plan=plan or (Plan(steps=()) if stop else fallback_plan(request.fallback_model_id)),
            stop=stop,
            pool=request.pool,
            usage=completion.usage,
            cost_usd=self.price.cost(completion.usage),
            latency_ms=latency_ms,
            backend=self.backend.name,
        )
