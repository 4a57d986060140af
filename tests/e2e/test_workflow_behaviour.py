"""Behaviour of the orchestration: parallelism, access lists, recursion bound, fallback.

The workers and planner backend are scripted fakes; the planner, parser, validator and
executor are the real ones. Each test runs twice: on the embedded executor, and through the
distributed stack (gRPC planner, aggregator and gateway on the Redis broker, Postgres).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.chat import ChatMessage
from conductor.errors import ProviderUnavailable
from conductor.executor import WorkflowExecutor
from conductor.pool import Pool, Price
from conductor.ports import ChatWorker, PlanFormat, PlannerBackend
from conductor.variants import BUILTIN_VARIANTS, Variant
from conductor.workflow import StepKind, StepStatus, WorkflowRecord, WorkflowStatus
from conductor_gateway.registry import build_workers
from conductor_planner import ConductorPlanner

from fakes.distributed import DistributedStack, distributed_stack
from fakes.openai_server import FakeOpenAIServer, completion, error, openai_compatible_spec
from fakes.scripted import ScriptedBackend, ScriptedWorker, lists, named_pool, scripted_gateway

ULTRA = BUILTIN_VARIANTS["conductor-ultra"]
NAMES = ["alpha", "beta", "gamma"]


def _pool(price: Price | None = None) -> Pool:
    return named_pool(NAMES, price)


class Runtime(Protocol):
    async def run(self, question: str, variant: Variant) -> WorkflowRecord: ...


# Workers by name, or scripted workers (named by their own name).
Workers = Sequence[ScriptedWorker] | Mapping[str, ChatWorker]
Make = Callable[[PlannerBackend, Pool, Workers], Runtime]


def _by_name(workers: Workers) -> Mapping[str, ChatWorker]:
    return workers if isinstance(workers, Mapping) else {w.name: w for w in workers}


@pytest.fixture(scope="module")
def stack(
    module_postgres_url: str, redis_url: str, module_redis_prefix: str
) -> Iterator[DistributedStack]:
    with distributed_stack(module_postgres_url, redis_url, module_redis_prefix) as running:
        yield running


@pytest.fixture(
    params=[
        "embedded",
        # Slow tier, as the API tests' distributed runtime: a stack per module behind it.
        pytest.param(
            "distributed", marks=[pytest.mark.postgres, pytest.mark.broker, pytest.mark.slow]
        ),
    ]
)
def make_runtime(request: pytest.FixtureRequest) -> Make:
    """Builds the runtime under test around a scripted planner backend and workers."""
    if request.param == "embedded":
        return lambda backend, pool, workers: WorkflowExecutor(
            planner=ConductorPlanner(backend),
            pool=pool,
            gateway=scripted_gateway(pool, _by_name(workers)),
        )
    stack: DistributedStack = request.getfixturevalue("stack")

    def make(backend: PlannerBackend, pool: Pool, workers: Workers) -> Runtime:
        stack.configure(backend, pool, _by_name(workers))
        return stack

    return make


def _executor(
    make_runtime: Make,
    outputs: list[str],
    workers: Sequence[ScriptedWorker],
    price: Price | None = None,
) -> tuple[Runtime, ScriptedBackend]:
    backend = ScriptedBackend(outputs=outputs)
    return make_runtime(backend, _pool(price), workers), backend


async def test_independent_steps_overlap_in_time(make_runtime: Make) -> None:
    workers = [ScriptedWorker(n, delay_s=0.3) for n in NAMES]
    plan = lists([0, 1, 2], ["left", "right", "join"], [[], [], [0, 1]])
    executor, _ = _executor(make_runtime, [plan], workers)

    result = await executor.run("q", ULTRA)

    assert result.status is WorkflowStatus.COMPLETED, result.error
    left, right, join = workers[0].calls[0], workers[1].calls[0], workers[2].calls[0]
    assert max(left.started, right.started) < min(left.finished, right.finished)
    assert join.started >= max(left.finished, right.finished)
    assert result.answer == "gamma-answer-1"


async def test_a_sequential_profile_never_overlaps_steps(make_runtime: Make) -> None:
    workers = [ScriptedWorker(n, delay_s=0.05) for n in NAMES]
    plan = lists([0, 1, 2], ["a", "b", "c"], [[], [], []])
    executor, _ = _executor(make_runtime, [plan], workers)
    variant = ULTRA.model_copy(update={"parallel": False})

    await executor.run("q", variant)

    calls = sorted((w.calls[0] for w in workers), key=lambda c: c.started)
    assert all(a.finished <= b.started for a, b in itertools.pairwise(calls))


_MARK = re.compile(r"(SUBTASK|ANSWER)-(\d)")


async def test_no_worker_sees_a_step_outside_its_access_list(make_runtime: Make) -> None:
    answer = lambda messages: "ANSWER-" + _MARK.findall(messages[-1].content)[-1][1]  # noqa: E731
    workers = [ScriptedWorker(n, delay_s=0.01, answer=answer) for n in NAMES]
    access: list[list[object]] = [[], [], [0], ["all"], [1, 3]]
    plan = lists([0, 1, 2, 0, 1], [f"SUBTASK-{i}" for i in range(5)], access)
    executor, _ = _executor(make_runtime, [plan], workers)

    result = await executor.run("QUESTION-TEXT", ULTRA)

    assert result.status is WorkflowStatus.COMPLETED, result.error
    expected_visible = {0: set(), 1: set(), 2: {0}, 3: {0, 1, 2}, 4: {1, 3}}
    calls = [c for w in workers for c in w.calls]
    assert len(calls) == 5
    for call in calls:
        step = int(_MARK.findall(call.messages[-1].content)[-1][1])
        seen = {int(i) for m in call.messages[:-1] for _, i in _MARK.findall(m.content)}
        assert seen == expected_visible[step], f"step {step} saw {seen}"
        # Visible steps arrive as past turns: their subtask, then their answer, in step order.
        roles = [m.role for m in call.messages]
        assert roles == ["user", "assistant"] * len(expected_visible[step]) + ["user"]
        # Only the first step (and turns replaying it) carry the user's question.
        has_question = any("QUESTION-TEXT" in m.content for m in call.messages)
        assert has_question == (step == 0 or 0 in expected_visible[step])
    assert [s.visible_steps for s in result.steps] == [sorted(v) for v in expected_visible.values()]


def _recursing_output(messages: Sequence[ChatMessage], first_steps: int) -> str:
    """A Conductor that names itself whenever it is offered, with as many steps as allowed."""
    prompt = messages[-1].content
    pool_size = len(re.findall(r"^Model \d+:", prompt, flags=re.MULTILINE))
    # The workflow's limit is in the system message; a round allowed fewer says so at the end.
    limit = re.search(r"Write at most (\d+) steps?\.", prompt) or re.search(
        r"Write a workflow of 1 to (\d+) steps", messages[0].content
    )
    assert limit is not None
    allowed = int(limit[1])
    offered = "the Conductor (you)" in prompt
    count = min(first_steps, allowed) if "Your previous workflow" not in prompt else allowed
    ids = [0] * count
    if offered and count >= 2:
        ids[-1] = pool_size - 1
    return lists(
        ids, [f"step {i}" for i in range(count)], [["all"] if i else [] for i in range(count)]
    )


class RecursingBackend(ScriptedBackend):
    def __init__(self, first_steps: int) -> None:
        super().__init__(outputs=[""])
        self.first_steps = first_steps

    async def generate(self, messages, *, json_schema, max_tokens, temperature):  # type: ignore[no-untyped-def]
        self.outputs = [_recursing_output(messages, self.first_steps)]
        return await super().generate(
            messages, json_schema=json_schema, max_tokens=max_tokens, temperature=temperature
        )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first_steps=st.integers(2, 5), rounds=st.integers(0, 3))
async def test_recursion_stops_at_its_bound(
    first_steps: int, rounds: int, make_runtime: Make
) -> None:
    backend = RecursingBackend(first_steps)
    workers = [ScriptedWorker(n) for n in NAMES]
    executor = make_runtime(backend, _pool(), workers)
    variant = Variant(name="deep", max_steps=5, recursion_rounds=rounds)

    result = await executor.run("q", variant)

    assert result.status is WorkflowStatus.COMPLETED, result.error
    first_plan = len(result.planner_calls[0].plan.steps)
    assert len(result.planner_calls) <= 1 + rounds
    # It does recurse when it may: this Conductor always names itself when offered.
    assert len(result.planner_calls) >= (2 if rounds else 1)
    assert len(result.steps) < 2 * first_plan
    assert all(call.valid for call in result.planner_calls)
    # The last round is never offered the Conductor, so the workflow ends on a worker's answer.
    assert result.steps[-1].kind is StepKind.WORKER
    assert result.answer == result.steps[-1].output


async def test_one_recursion_round_sees_the_previous_plan_and_answer(make_runtime: Make) -> None:
    first = lists([0, 3], ["Solve.", "Review."], [[], ["all"]])
    second = lists([1], ["Check the last answer and fix it."], [["all"]])
    workers = [ScriptedWorker(n) for n in NAMES]
    executor, backend = _executor(make_runtime, [first, second], workers)

    result = await executor.run("q", ULTRA)

    assert result.status is WorkflowStatus.COMPLETED, result.error
    assert [s.kind for s in result.steps] == [StepKind.WORKER, StepKind.CONDUCTOR, StepKind.WORKER]
    assert [s.round for s in result.steps] == [0, 0, 1]
    replan_prompt = backend.requests[1]["messages"][-1].content
    # The last answer (step 0's) is shown once, with the step that gave it.
    assert "Step 0 (Model 0): alpha-answer-1" in replan_prompt
    assert "Last answer: the answer of step 0 above." in replan_prompt
    assert "the Conductor (you)" not in replan_prompt  # one round by default: no more offers
    # "all" in the second round reaches back to the first round's worker step.
    assert result.steps[2].visible_steps == [0]
    assert result.steps[1].status is StepStatus.SUCCEEDED
    assert result.answer == "beta-answer-1"


async def test_recursion_round_that_stops_keeps_the_last_answer(make_runtime: Make) -> None:
    first = lists([0, 3], ["Solve.", "Review."], [[], ["all"]])
    stop = "It is right.\nmodel_id = []\nsubtasks = []\naccess_list = []"
    executor, _ = _executor(make_runtime, [first, stop], [ScriptedWorker(n) for n in NAMES])

    result = await executor.run("q", ULTRA)

    assert result.planner_calls[1].stop
    assert result.planner_calls[1].valid
    assert result.answer == "alpha-answer-1"


@pytest.mark.parametrize(
    ("output", "error"),
    [
        ("I would ask model one, I think.", "no plan found"),
        (lists([7], ["x"], [[]]), "not in the pool"),
        (lists([0, 1], ["x"], [[], []]), "differ in length"),
    ],
)
async def test_invalid_conductor_output_falls_back_and_is_recorded(
    output: str, error: str, make_runtime: Make
) -> None:
    workers = [ScriptedWorker(n) for n in NAMES]
    executor, _ = _executor(make_runtime, [output], workers)

    result = await executor.run("What is 2+2?", ULTRA)

    call = result.planner_calls[0]
    assert not result.plan_valid
    assert not call.valid
    assert any(error in e for e in call.errors), call.errors
    assert call.raw_output == output
    assert [(s.worker, s.subtask) for s in result.steps] == [("alpha", "Answer the question.")]
    assert "What is 2+2?" in workers[0].calls[0].messages[-1].content
    assert result.status is WorkflowStatus.COMPLETED
    assert result.answer == "alpha-answer-1"


async def test_a_failing_step_fails_the_workflow_with_its_reason(make_runtime: Make) -> None:
    workers = [
        ScriptedWorker("alpha", fail_with=ProviderUnavailable("HTTP 503 from provider")),
        ScriptedWorker("beta", delay_s=20.0),
        ScriptedWorker("gamma"),
    ]
    plan = lists([0, 1, 2], ["a", "b", "c"], [[], [], ["all"]])
    executor, _ = _executor(make_runtime, [plan], workers)

    started = time.perf_counter()
    result = await executor.run("q", ULTRA)
    returned_after_s = time.perf_counter() - started

    assert result.status is WorkflowStatus.FAILED
    assert result.error is not None
    assert "step 0 (alpha)" in result.error
    assert "503" in result.error
    statuses = [s.status for s in result.steps]
    assert statuses == [StepStatus.FAILED, StepStatus.CANCELLED, StepStatus.CANCELLED]
    assert result.steps[0].attempts[0].error_class == "ProviderUnavailable"
    assert workers[2].calls == []
    assert result.latency_ms < 2000  # the slow sibling was cancelled, not awaited
    assert returned_after_s < 2  # ...by the caller either
    # ...and its provider call is cancelled too, not left running and paid for (distributed:
    # the gateway hears that the workflow ended).
    assert await asyncio.to_thread(workers[1].cancellation.wait, 2)
    assert 0 < workers[1].calls[0].cancelled - started < 2


async def test_a_step_refused_by_its_provider_cancels_the_slow_siblings_http_call(
    make_runtime: Make,
) -> None:
    # Given a parallel plan on two OpenAI-compatible providers: alpha's refuses the call at once
    # (HTTP 400, not retried), beta's takes 20 s to answer
    refusing, slow = FakeOpenAIServer(), FakeOpenAIServer()
    refusing.enqueue(error(400, "'messages' is malformed"))
    slow.enqueue(completion("late", delay_s=20))
    refusing.start()
    slow.start()
    pool = Pool(
        workers=(
            openai_compatible_spec("alpha", refusing.base_url),
            openai_compatible_spec("beta", slow.base_url),
        )
    )
    workers = build_workers(pool)
    try:
        plan = lists([0, 1], ["a", "b"], [[], []])
        runtime = make_runtime(ScriptedBackend(outputs=[plan]), pool, workers)

        # When the workflow runs
        started = time.time()
        result = await runtime.run("q", ULTRA)
        returned_after_s = time.time() - started

        # Then it fails within 2 s with alpha's reason...
        assert result.status is WorkflowStatus.FAILED
        assert result.error is not None
        assert "400" in result.error
        assert returned_after_s < 2
        # ...and beta's provider sees its request given up within 2 s, not awaited and billed
        for _ in range(40):  # the server notices the closed connection within 50 ms
            if slow.abandoned:
                break
            await asyncio.sleep(0.05)
        assert len(slow.requests) == 1
        assert [request for request, _ in slow.abandoned] == slow.requests
        assert slow.abandoned[0][1] - started < 2
    finally:
        for worker in workers.values():
            await worker.aclose()
        refusing.stop()
        slow.stop()


async def test_usage_and_cost_count_every_step_and_the_conductor(make_runtime: Make) -> None:
    workers = [ScriptedWorker(n) for n in NAMES]
    plan = lists([0, 1], ["a b", "c"], [[], [0]])
    executor, _ = _executor(make_runtime, [plan], workers, price=Price(input=1.0, output=2.0))

    result = await executor.run("q", ULTRA)

    conductor = result.planner_calls[0].usage
    steps_prompt = sum(s.usage.prompt_tokens for s in result.steps)
    steps_completion = sum(s.usage.completion_tokens for s in result.steps)
    assert result.usage.prompt_tokens == conductor.prompt_tokens + steps_prompt
    assert result.usage.completion_tokens == conductor.completion_tokens + steps_completion
    expected_cost = (steps_prompt * 1.0 + steps_completion * 2.0) / 1e6
    assert result.cost_usd == pytest.approx(expected_cost)
    assert result.cost_usd == pytest.approx(sum(s.cost_usd for s in result.steps))


async def test_the_mini_variant_is_offered_one_step_and_no_recursion(make_runtime: Make) -> None:
    workers = [ScriptedWorker(n) for n in NAMES]
    executor, backend = _executor(make_runtime, [lists([1], ["Answer."], [[]])], workers)

    result: WorkflowRecord = await executor.run("q", BUILTIN_VARIANTS["conductor-mini"])

    prompt = backend.requests[0]["messages"]
    assert "1 to 1 steps" in prompt[0].content
    assert "the Conductor (you)" not in prompt[-1].content
    assert result.answer == "beta-answer-1"


@pytest.mark.parametrize("question", ["", "   ", "x" * 100_001])
async def test_bad_questions_are_refused_before_anything_runs(
    question: str, make_runtime: Make
) -> None:
    executor, backend = _executor(make_runtime, ["unused"], [ScriptedWorker(n) for n in NAMES])
    with pytest.raises(ValueError, match="question"):
        await executor.run(question, ULTRA)
    assert backend.requests == []


async def test_later_round_numbers_are_local_and_all_reaches_back(make_runtime: Make) -> None:
    first = lists([0, 1, 3], ["A", "B", "Review."], [[], [], ["all"]])
    second = lists([2, 0], ["C", "D"], [[], [0]])
    workers = [ScriptedWorker(n) for n in NAMES]
    executor, _ = _executor(make_runtime, [first, second], workers)

    result = await executor.run("q", ULTRA)

    assert [s.index for s in result.steps] == [0, 1, 2, 3, 4]
    # Round 1's "[0]" is its own first step (global 3), never round 0's step 0.
    assert result.steps[4].visible_steps == [3]
    assert result.steps[3].visible_steps == []


async def test_a_failure_before_the_conductor_step_leaves_no_step_unfinished(
    make_runtime: Make,
) -> None:
    workers = [
        ScriptedWorker("alpha", fail_with=ProviderUnavailable("down")),
        ScriptedWorker("beta"),
        ScriptedWorker("gamma"),
    ]
    executor, _ = _executor(
        make_runtime, [lists([0, 3], ["Solve.", "Review."], [[], ["all"]])], workers
    )

    result = await executor.run("q", ULTRA)

    assert result.status is WorkflowStatus.FAILED
    assert [s.status for s in result.steps] == [StepStatus.FAILED, StepStatus.CANCELLED]
    assert all(s.finished_at is not None for s in result.steps)


async def test_an_empty_last_answer_is_the_answer(make_runtime: Make) -> None:
    workers = [
        ScriptedWorker("alpha"),
        ScriptedWorker("beta", answer=lambda _: ""),
        ScriptedWorker("gamma"),
    ]
    executor, _ = _executor(
        make_runtime, [lists([0, 1], ["draft", "final"], [[], ["all"]])], workers
    )

    result = await executor.run("q", ULTRA)

    assert result.status is WorkflowStatus.COMPLETED
    assert result.answer == ""


class _BrokenObserver:
    async def observe(self, *args: object) -> None:
        raise RuntimeError("database unreachable")


async def test_a_failing_observer_does_not_lose_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers = [ScriptedWorker(n) for n in NAMES]
    executor = WorkflowExecutor(
        planner=ConductorPlanner(ScriptedBackend(outputs=[lists([0], ["a"], [[]])])),
        pool=_pool(),
        gateway=scripted_gateway(_pool(), {w.name: w for w in workers}),
        observers=[_BrokenObserver()],
    )

    result = await executor.run("q", ULTRA)

    assert result.status is WorkflowStatus.COMPLETED
    assert result.answer == "alpha-answer-1"
    assert "database unreachable" in caplog.text


async def test_recursion_under_the_json_schema_lets_the_new_first_step_see_earlier_rounds(
    make_runtime: Make,
) -> None:
    def step(model_id: int, subtask: str, access: list[object]) -> dict[str, object]:
        return {"model_id": model_id, "subtask": subtask, "access_list": access}

    first = {"reasoning": "r", "steps": [step(0, "Solve.", []), step(3, "Review.", ["all"])]}
    second = {"reasoning": "r", "steps": [step(1, "Check the answer above.", ["all"])]}
    backend = ScriptedBackend(
        outputs=[json.dumps(first), json.dumps(second)], plan_format=PlanFormat.JSON
    )
    workers = [ScriptedWorker(n) for n in NAMES]
    executor = make_runtime(backend, _pool(), workers)

    result = await executor.run("q", ULTRA)

    # Each output is one the constrained decoder could have produced under its round's schema.
    for request, output in zip(backend.requests, (first, second), strict=True):
        jsonschema.validate(output, request["json_schema"])
    assert all(call.valid for call in result.planner_calls)
    assert result.steps[2].visible_steps == [0]
    assert "alpha-answer-1" in workers[1].calls[0].messages[1].content
