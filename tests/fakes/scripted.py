"""Scripted, in-process stand-ins for workers and planner backends (no network, no model).

They implement the same interfaces as the real ones, so the executor under test runs its real
code paths; they also log what they received and when, for the behavioural tests.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor.answer_format import AnswerFormat
from conductor.chat import ChatMessage, Completion, ToolCall, ToolUse, Usage
from conductor.pool import Pool, Price, Provider, Quotas, WorkerSpec
from conductor.ports import ChatWorker, PlanFormat, PromptForm
from conductor.streaming import StreamEnd, StreamEvent, TextDelta
from conductor_gateway.gateway import WorkerGateway
from conductor_gateway.retry import RetryPolicy


@dataclass
class Call:
    messages: list[ChatMessage]
    started: float
    max_tokens: int = 0
    temperature: float = 0.0
    finished: float = 0.0
    cancelled: float = 0.0  # perf_counter() when the call was cancelled (its caller gave up)


@dataclass
class ScriptedWorker:
    """Answers ``f"{name}-answer-{n}"`` (or ``answer(messages)``) after ``delay_s`` seconds."""

    name: str
    delay_s: float = 0.0
    answer: Callable[[list[ChatMessage]], str] | None = None
    fail_with: Exception | None = None
    calls: list[Call] = field(default_factory=list)
    # Set when a call is cancelled; a threading.Event, since a distributed stack's gateway runs
    # the worker on another thread's loop.
    cancellation: threading.Event = field(default_factory=threading.Event)
    tools_offered: list[ToolUse] = field(default_factory=list)
    # Answers this JSON when its provider is asked for JSON natively (``complete_in_format``),
    # whatever the prompt says; None: it answers as it would anyway.
    native_json: dict[str, Any] | None = None
    formats_asked: list[AnswerFormat] = field(default_factory=list)
    # Streamed, its answer comes a word at a time, this long apart (after ``delay_s``).
    word_delay_s: float = 0.0
    streams: int = 0  # calls made streamed

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        call = Call(
            messages=list(messages),
            started=time.perf_counter(),
            max_tokens=max_tokens,
            temperature=temperature,
        )
        self.calls.append(call)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            call.cancelled = time.perf_counter()
            self.cancellation.set()
            raise
        call.finished = time.perf_counter()
        if self.fail_with is not None:
            raise self.fail_with
        text = (
            self.answer(call.messages) if self.answer else f"{self.name}-answer-{len(self.calls)}"
        )
        words, finish = text.split(), "stop"
        if len(words) > max_tokens:  # a word a token: cut at the bound, as a model is
            text, finish = " ".join(words[:max_tokens]), "length"
        prompt_tokens = sum(len(m.content.split()) for m in messages)
        return Completion(
            text=text,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(text.split())),
            model=self.name,
            finish_reason=finish,
        )

    async def complete_with_tools(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolUse,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """Offered tools, it calls one (the one it must, else the first; every one when a call
        is required) with arguments made from its parameters' schema, unless told not to; given
        a tool's result (a tool turn, or a workflow's conversation that shows one), it answers
        with it unless a call is forced."""
        self.tools_offered.append(tools)
        completion = await self.complete(messages, max_tokens=max_tokens, temperature=temperature)
        result = tool_result(messages)
        forced = tools.choice not in ("auto", "none")
        if messages[-1].role == "tool" or tools.choice == "none" or (result and not forced):
            if result is not None:
                text = f"{self.name} read the tool's result: {result}"
                return completion.model_copy(update={"text": text})
            return completion
        if tools.choice == "required":  # every tool, in parallel
            chosen = list(tools.tools)
        else:
            chosen = [next((t for t in tools.tools if t.name == tools.choice), tools.tools[0])]
        calls = tuple(
            ToolCall(
                id=f"call_{len(self.calls)}_{n}",
                name=tool.name,
                arguments=json.dumps(example_arguments(tool.parameters or {})),
            )
            for n, tool in enumerate(chosen)
        )
        return completion.model_copy(
            update={"text": "", "tool_calls": calls, "finish_reason": "tool_calls"}
        )

    async def complete_in_format(
        self,
        messages: Sequence[ChatMessage],
        answer_format: AnswerFormat,
        *,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        """Asked natively for JSON: ``native_json`` if it has one, else its usual answer."""
        self.formats_asked.append(answer_format)
        completion = await self.complete(messages, max_tokens=max_tokens, temperature=temperature)
        if self.native_json is None:
            return completion
        return completion.model_copy(update={"text": json.dumps(self.native_json)})

    async def stream(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, temperature: float
    ) -> AsyncIterator[StreamEvent]:
        """Its answer a word at a time, ``word_delay_s`` apart; the call is marked finished
        once the last word is out."""
        self.streams += 1
        completion = await self.complete(messages, max_tokens=max_tokens, temperature=temperature)
        call = self.calls[-1]
        call.finished = 0.0
        for i, word in enumerate(completion.text.split(" ")):
            if i:
                await asyncio.sleep(self.word_delay_s)
            yield TextDelta(word if i == 0 else f" {word}")
        call.finished = time.perf_counter()
        yield StreamEnd(completion.usage, completion.finish_reason, completion.model)

    async def aclose(self) -> None:
        return None


# How a workflow's question shows a tool's result (conductor_api.openai_shared.render_question).
_TEXT_RESULT = re.compile(r"^Tool result \([^)]*\): (.*)$", re.MULTILINE)


def tool_result(messages: Sequence[ChatMessage]) -> str | None:
    """The last tool result the messages hold: a tool turn's, or one shown in a turn's text."""
    if messages[-1].role == "tool":
        return messages[-1].content
    shown = [m for message in messages for m in _TEXT_RESULT.findall(message.content)]
    return shown[-1] if shown else None


EXAMPLE_VALUES: dict[str, Any] = {
    "string": "Paris",
    "integer": 7,
    "number": 7.5,
    "boolean": True,
    "array": [],
    "object": {},
}


def example_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments for a function's parameters: a fixed value of each required property's type
    (every property's when none is marked required), as a model leaves optional ones out."""
    properties = schema.get("properties") or {}
    required = schema.get("required")
    return {
        name: EXAMPLE_VALUES.get(str(spec.get("type", "string")), "Paris")
        for name, spec in properties.items()
        if required is None or name in required
    }


def scripted_gateway(
    pool: Pool, workers: Mapping[str, ChatWorker], *, max_attempts: int = 1
) -> WorkerGateway:
    """The real gateway around scripted workers; one attempt and no backoff unless asked."""
    policy = RetryPolicy(max_attempts=max_attempts, base_delay_s=0.0)
    return WorkerGateway(pool, workers, policy=policy)


def named_pool(
    names: Sequence[str],
    price: Price | None = None,
    fallbacks: Mapping[str, Sequence[str]] | None = None,
    quotas: Mapping[str, Quotas] | None = None,
    providers: Mapping[str, Provider] | None = None,
) -> Pool:
    """Workers ``names`` (described as "worker NAME"), never reached over the network."""
    fallbacks, quotas, providers = fallbacks or {}, quotas or {}, providers or {}
    return Pool(
        workers=tuple(
            WorkerSpec(
                name=n,
                provider=providers.get(n, Provider.OPENAI_COMPATIBLE),
                model=n,
                base_url="http://127.0.0.1:9",
                description=f"worker {n}",
                price=price or Price(),
                fallbacks=tuple(fallbacks.get(n, ())),
                quotas=quotas.get(n, Quotas()),
            )
            for n in names
        )
    )


@dataclass
class ScriptedBackend:
    """A planner backend that returns scripted raw Conductor outputs, one per call."""

    outputs: list[str]
    plan_format: PlanFormat = PlanFormat.LISTS
    name: str = "scripted"
    prompt_form: PromptForm = PromptForm.FULL
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
    ) -> Completion:
        self.requests.append({"messages": list(messages), "json_schema": json_schema})
        index = min(len(self.requests) - 1, len(self.outputs) - 1)
        text = self.outputs[index]
        return Completion(text=text, usage=Usage(prompt_tokens=100, completion_tokens=20))

    async def aclose(self) -> None:
        return None


def lists(ids: list[int], subtasks: list[str], access: list[list[Any]]) -> str:
    """A raw Conductor output in the paper's form."""
    return f"Reasoning.\nmodel_id = {ids}\nsubtasks = {subtasks!r}\naccess_list = {access!r}"
