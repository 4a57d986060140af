"""A Codex CLI turn, as its Responses request body, rebuilt field by field from Codex's source.

Codex (github.com/openai/codex, Rust) builds each turn's body in
``codex-rs/core/src/client.rs`` (``ModelClient::build_responses_request``) into the
``ResponsesApiRequest`` struct of ``codex-rs/codex-api/src/common.rs``:

- ``model``, ``instructions`` (its base instructions), ``input`` (the whole conversation each
  turn: it sends ``store: false``, so nothing is continued by id);
- ``tools`` from ``create_tools_json_for_responses_api`` (``codex-rs/tools``: ``ToolSpec``
  serialised with its ``type`` tag: ``function``, ``namespace`` (an MCP server's or app's
  functions), ``web_search``, ``local_shell``, ``custom``, ``image_generation``,
  ``tool_search``); ``web_search`` is pushed while its ``web_search`` setting is ``cached`` (the
  default: ``external_web_access: false``) or ``live``, and left out with ``"disabled"``;
- ``tool_choice: "auto"``, ``parallel_tool_calls``;
- ``reasoning: {effort, summary}`` always (``build_reasoning``; each key left out when unset),
  ``include: ["reasoning.encrypted_content"]`` always, ``store: false``, ``stream: true``;
- ``prompt_cache_key`` (the session's id), ``text`` only with a verbosity or an output schema,
  ``service_tier`` only when one is chosen, ``stream_options`` only for OpenAI's own provider;
- ``client_metadata`` always (``CodexResponsesMetadata::client_metadata`` in
  ``codex-rs/core/src/responses_metadata.rs``): the installation, session, thread, window and
  turn ids, and ``x-codex-turn-metadata``, a JSON text of the turn (sandbox, workspaces...).

No Codex code is here: the ids and texts are made up, the shape is Codex's as its source
read when this was written. The binary itself (0.171.0) is run against the API by
``tests/api/test_codex_cli.py``; measured there, its turns also carry a ``namespace`` tool
(``multi_agent_v1``, its sub-agent functions) among nine tools, its base instructions as a
first developer message instead of ``instructions``, item ids, and ``root_turn_id`` in
``client_metadata``. This body keeps the fields each test here needs.
"""

from __future__ import annotations

import copy
import json
from typing import Any

SESSION = "5f0c1d8e-3b8a-4c59-9d2e-0b7f3a9e6c41"
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The command to execute",
            },
            "workdir": {"type": "string", "description": "The working directory"},
            "timeout_ms": {"type": "number", "description": "The timeout in milliseconds"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
UPDATE_PLAN = {
    "type": "function",
    "name": "update_plan",
    "description": "Updates the task plan.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "explanation": {"type": "string"},
            "plan": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"step": {"type": "string"}, "status": {"type": "string"}},
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["plan"],
        "additionalProperties": False,
    },
}
# web_search = "cached", Codex's default.
WEB_SEARCH = {"type": "web_search", "external_web_access": False}
# An MCP server's tools, as Codex groups them.
NAMESPACE = {
    "type": "namespace",
    "name": "mcp__docs__",
    "description": "Tools of the MCP server docs.",
    "tools": [
        {
            "type": "function",
            "name": "search",
            "description": "Search the docs.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ],
}
TURN_METADATA = {
    "turn_id": "7a1e0c4b-2f61-4d8e-8a0f-5c3b9d2e1f70",
    "request_kind": "turn",
    "sandbox": "workspace-write",
    "workspaces": {"/home/dev/project": {"associated_remote_urls": {}, "has_changes": False}},
}
ASK = "List the files in this folder."


def _message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def codex_request(model: str, *, web_search: bool = True) -> dict[str, Any]:
    """A first turn's body as Codex sends it for ``model``; ``web_search`` False is Codex with
    ``web_search = "disabled"`` in its config.toml."""
    tools = [SHELL, UPDATE_PLAN] + ([WEB_SEARCH] if web_search else [])
    return copy.deepcopy(
        {
            "model": model,
            "instructions": "You are Codex, a coding agent. Use the shell tool to inspect files.",
            "input": [
                _message("developer", "<permissions instructions>sandbox: workspace-write"),
                _message("user", "<environment_context><cwd>/home/dev/project</cwd>"),
                _message("user", ASK),
            ],
            "tools": tools,
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": SESSION,
            "client_metadata": {
                "x-codex-installation-id": "0d6c2b7e-91a4-4f3b-8c55-6e2f1a9b3c07",
                "session_id": SESSION,
                "thread_id": SESSION,
                "x-codex-window-id": "1",
                "turn_id": TURN_METADATA["turn_id"],
                "x-codex-turn-metadata": json.dumps(TURN_METADATA),
            },
        }
    )


def next_turn(first: dict[str, Any], call: dict[str, Any], output: str) -> dict[str, Any]:
    """The next turn's body: the same request with the model's call and its output appended
    to the input, as Codex sends its whole history again (it stores nothing server-side)."""
    body = copy.deepcopy(first)
    body["input"] += [
        {
            "type": "function_call",
            "name": call["name"],
            "arguments": call["arguments"],
            "call_id": call["call_id"],
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": output},
    ]
    return body
