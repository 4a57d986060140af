"""The server-sent events of a streamed ``/v1/responses`` answer, as the OpenAI SDKs parse them
(``openai.types.responses.ResponseStreamEvent``).

A workflow's answer comes as one delta when it finishes, unless its answering step streams
(``WorkflowMachine._streams``): its text then arrives in deltas as the worker writes it. Until
then the stream carries the workflow's progress as a reasoning item at output index 0 (a
summary part per fact, ``progress_summary``), closed before the answer's first item starts:
what happens after that (the answering step's end) is not told. The response that ends the
stream lists the items as they were streamed.
"""

from __future__ import annotations

import json
from typing import Any

from conductor_adapters.store.responses import StoredResponse
from conductor_api.responses_objects import (
    function_call_item,
    output_item,
    output_item_id,
    reasoning_item,
    reasoning_item_id,
    summary_part,
    text_part,
)


class ResponseEvents:
    """The events of one streamed response, numbered from 0 as the Responses API numbers them."""

    def __init__(self, stored: StoredResponse) -> None:
        self.stored = stored
        self.sequence = 0
        self.text_started = False  # the message's text is being streamed as it is written
        # The reasoning item's summary as streamed; None: no reasoning item (yet).
        self.summary: list[str] | None = None
        self.reasoning_open = False

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        body = json.dumps(payload, ensure_ascii=False, default=str)
        return f"event: {kind}\ndata: {body}\n\n"

    def started(self, snapshot: dict[str, Any]) -> list[str]:
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def answered(
        self,
        text: str,
        final: dict[str, Any],
        calls: list[dict[str, Any]] | None = None,
    ) -> list[str]:
        """From the first output item's start to ``response.completed``: the text's message
        (unless the answer is function calls alone), then each function call."""
        calls = calls or []
        with_text = not calls or bool(text)  # the message item comes first
        lines = self._reasoning_done()
        if self.text_started:  # its start and text went out already: its ends are left
            lines += self._message_done(text)
        elif with_text:
            lines += self._message(text)
        for i, call in enumerate(calls):
            lines += self._function_call(with_text, i, call)
        final = {**final, "output": self._streamed(final["output"])}
        # An answer cut at max_output_tokens ends "incomplete", as the Responses API ends it.
        end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*lines, self.event(end, response=final)]

    def _streamed(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A response's ``output`` with the reasoning item as it was streamed (the stored
        workflow may tell more: what happened once the answer had begun)."""
        rest = [item for item in output if item["type"] != "reasoning"]
        if self.summary is None:
            return rest
        return [reasoning_item(self.stored, self.summary, "completed"), *rest]

    @property
    def _first(self) -> int:
        """The output index of the answer's first item: after the reasoning item, if any."""
        return 0 if self.summary is None else 1

    # -- the reasoning item -------------------------------------------------------------------

    def progress(self, facts: list[str]) -> list[str]:
        """A summary part for each of a workflow's progress ``facts``, the reasoning item
        started first; nothing once the answer has begun (the item is closed then)."""
        closed = self.text_started or (self.summary is not None and not self.reasoning_open)
        if not facts or closed:
            return []
        lines = [] if self.summary is not None else self._reasoning_start()
        for fact in facts:
            lines += self._summary_part(fact)
        return lines

    def _reasoning_start(self) -> list[str]:
        self.summary, self.reasoning_open = [], True
        return [
            self.event(
                "response.output_item.added",
                output_index=0,
                item=reasoning_item(self.stored, [], "in_progress"),
            )
        ]

    def _summary_part(self, text: str) -> list[str]:
        assert self.summary is not None
        where = {
            "item_id": reasoning_item_id(self.stored),
            "output_index": 0,
            "summary_index": len(self.summary),
        }
        self.summary.append(text)
        return [
            self.event("response.reasoning_summary_part.added", **where, part=summary_part("")),
            self.event("response.reasoning_summary_text.delta", **where, delta=text),
            self.event("response.reasoning_summary_text.done", **where, text=text),
            self.event("response.reasoning_summary_part.done", **where, part=summary_part(text)),
        ]

    def _reasoning_done(self) -> list[str]:
        """The reasoning item's end, where it is open: before the answer's first item."""
        if not self.reasoning_open or self.summary is None:
            return []
        self.reasoning_open = False
        return [
            self.event(
                "response.output_item.done",
                output_index=0,
                item=reasoning_item(self.stored, self.summary, "completed"),
            )
        ]

    # -- the answer ---------------------------------------------------------------------------

    def _function_call(self, after_text: bool, index: int, call: dict[str, Any]) -> list[str]:
        output_index = self._first + index + (1 if after_text else 0)
        done = function_call_item(self.stored, index, call, "completed")
        where = {"item_id": done["id"], "output_index": output_index}
        return [
            self.event(
                "response.output_item.added",
                output_index=output_index,
                item=function_call_item(self.stored, index, call, "in_progress"),
            ),
            self.event("response.function_call_arguments.delta", **where, delta=done["arguments"]),
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=done["name"],
                arguments=done["arguments"],
            ),
            self.event("response.output_item.done", output_index=output_index, item=done),
        ]

    def text_delta(self, text: str) -> list[str]:
        """A piece of the answer's text as it is written (the reasoning item's end and the
        message's start first)."""
        lines = [] if self.text_started else self._reasoning_done() + self._message_start()
        self.text_started = True
        where = self._in_message()
        return [*lines, self.event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def _in_message(self) -> dict[str, Any]:
        item = output_item_id(self.stored)
        return {"item_id": item, "output_index": self._first, "content_index": 0}

    def _message_start(self) -> list[str]:
        where = self._in_message()
        return [
            self.event(
                "response.output_item.added",
                output_index=self._first,
                item=output_item(self.stored, "", "in_progress"),
            ),
            self.event("response.content_part.added", **where, part=text_part("")),
        ]

    def _message(self, text: str) -> list[str]:
        where = self._in_message()
        return [
            *self._message_start(),
            self.event("response.output_text.delta", **where, delta=text, logprobs=[]),
            *self._message_done(text),
        ]

    def _message_done(self, text: str) -> list[str]:
        where = self._in_message()
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=text_part(text)),
            self.event(
                "response.output_item.done",
                output_index=self._first,
                item=output_item(self.stored, text, "completed"),
            ),
        ]

    def failed(self, response: dict[str, Any], status: str, message: str) -> list[str]:
        """``response.failed`` (the Responses API has no other end for a failed or cancelled
        response), with the reason in the response's ``error``; the reasoning item, where it
        is open, ends first."""
        lines = self._reasoning_done()
        reasoning = self._streamed([])
        failed = {
            **response,
            "status": status,
            "output": reasoning,
            "error": {"code": "server_error", "message": message},
        }
        return [*lines, self.event("response.failed", response=failed)]
