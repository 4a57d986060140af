"""The server-sent events of a streamed ``/v1/responses`` answer, as the OpenAI SDKs parse them
(``openai.types.responses.ResponseStreamEvent``).

A workflow's answer comes as one delta when it finishes, unless its answering step streams
(``WorkflowMachine._streams``): its text then arrives in deltas as the worker writes it. Until
then the stream carries the workflow's progress as SSE comments, which the SDKs skip.
"""

from __future__ import annotations

import json
from typing import Any

from conductor_adapters.store.responses import StoredResponse
from conductor_api.responses_objects import (
    function_call_item,
    output_item,
    output_item_id,
    text_part,
)


class ResponseEvents:
    """The events of one streamed response, numbered from 0 as the Responses API numbers them."""

    def __init__(self) -> None:
        self.sequence = 0
        self.text_started = False  # the message's text is being streamed as it is written

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
        stored: StoredResponse,
        text: str,
        final: dict[str, Any],
        calls: list[dict[str, Any]] | None = None,
    ) -> list[str]:
        """From the first output item's start to ``response.completed``: the text's message
        (unless the answer is function calls alone), then each function call."""
        calls = calls or []
        with_text = not calls or bool(text)  # the message item comes first, at index 0
        lines: list[str] = []
        if self.text_started:  # its start and text went out already: its ends are left
            lines = self._message_done(stored, text)
        elif with_text:
            lines = self._message(stored, text)
        for i, call in enumerate(calls):
            lines += self._function_call(stored, with_text, i, call)
        # An answer cut at max_output_tokens ends "incomplete", as the Responses API ends it.
        end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*lines, self.event(end, response=final)]

    def _function_call(
        self, stored: StoredResponse, after_text: bool, index: int, call: dict[str, Any]
    ) -> list[str]:
        output_index = index + (1 if after_text else 0)
        done = function_call_item(stored, index, call, "completed")
        where = {"item_id": done["id"], "output_index": output_index}
        return [
            self.event(
                "response.output_item.added",
                output_index=output_index,
                item=function_call_item(stored, index, call, "in_progress"),
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

    def text_delta(self, stored: StoredResponse, text: str) -> list[str]:
        """A piece of the answer's text as it is written (the message's start first)."""
        lines = [] if self.text_started else self._message_start(stored)
        self.text_started = True
        where = {"item_id": output_item_id(stored), "output_index": 0, "content_index": 0}
        return [*lines, self.event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def _message_start(self, stored: StoredResponse) -> list[str]:
        where = {"item_id": output_item_id(stored), "output_index": 0, "content_index": 0}
        return [
            self.event(
                "response.output_item.added",
                output_index=0,
                item=output_item(stored, "", "in_progress"),
            ),
            self.event("response.content_part.added", **where, part=text_part("")),
        ]

    def _message(self, stored: StoredResponse, text: str) -> list[str]:
        where = {"item_id": output_item_id(stored), "output_index": 0, "content_index": 0}
        return [
            *self._message_start(stored),
            self.event("response.output_text.delta", **where, delta=text, logprobs=[]),
            *self._message_done(stored, text),
        ]

    def _message_done(self, stored: StoredResponse, text: str) -> list[str]:
        where = {"item_id": output_item_id(stored), "output_index": 0, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=text_part(text)),
            self.event(
                "response.output_item.done",
                output_index=0,
                item=output_item(stored, text, "completed"),
            ),
        ]

    def failed(self, response: dict[str, Any], status: str, message: str) -> str:
        """``response.failed`` (the Responses API has no other end for a failed or cancelled
        response), with the reason in the response's ``error``."""
        failed = {
            **response,
            "status": status,
            "error": {"code": "server_error", "message": message},
        }
        return self.event("response.failed", response=failed)
