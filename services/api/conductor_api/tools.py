"""Function calling on the OpenAI-compatible surfaces: the tools a client offers, the calls a
worker asks for, and their results, read from the Chat Completions and Responses wire forms.

Tools reach a worker whose wire format carries them (``TOOL_CALLING_PROVIDERS``): on a direct
call (model = a worker's name), that worker; on a workflow, the step that writes its answer
(the machine puts it on such a worker). The worker's calls go back to the client, which runs
them and sends their results in its next request; a workflow reads the tool calls and results
of its conversation as part of the conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from conductor.chat import ToolCall, ToolSpec, ToolUse
from conductor.pool import TOOL_CALLING_PROVIDERS, WorkerSpec
from conductor_api.errors import ApiError, invalid, unsupported

CHOICES = ("auto", "none", "required")
# Tools the client does not run itself, and how the clients that send them by default stop.
HOSTED = {
    "web_search": "No worker searches the web for a request; Codex CLI sends it unless its "
    'config.toml says web_search = "disabled" (or -c web_search=disabled).',
}
# A Responses ``namespace`` tool groups functions (Codex CLI's sub-agent tools, an MCP
# server's): a worker is offered each as one plain function, ``<namespace>__<name>``, and its
# call goes back to the client as ``{"name", "namespace"}``, which is how the client routes it.
NAMESPACE_JOIN = "__"
TOOL_WORKERS = ", ".join(sorted(p.value for p in TOOL_CALLING_PROVIDERS))


def _tool_spec(function: Any, param: str) -> ToolSpec:
    if not isinstance(function, Mapping):
        raise invalid(param, "expected a function object")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise invalid(f"{param}.parameters", "expected a JSON Schema object")
    try:
        return ToolSpec(
            name=function.get("name"),
            description=function.get("description"),
            parameters=parameters,
            strict=function.get("strict"),
        )
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise invalid(f"{param}.{where}", exc.errors()[0]["msg"]) from None


def namespaced(namespace: str, name: str) -> str:
    """A namespace's function as a worker is offered it: one plain function name."""
    return f"{namespace}{NAMESPACE_JOIN}{name}"


def split_namespaced(name: str, namespaces: list[str]) -> tuple[str | None, str]:
    """(the namespace, the function's own name) of a called name; (None, name) for a plain
    function."""
    for namespace in namespaces:
        prefix = namespaced(namespace, "")
        if name.startswith(prefix) and len(name) > len(prefix):
            return namespace, name[len(prefix) :]
    return None, name


def namespaces_of(tools: Any) -> list[str]:
    """The names of the namespace tools in a Responses request's ``tools``."""
    if not isinstance(tools, list):
        return []
    return [
        str(t["name"])
        for t in tools
        if isinstance(t, Mapping) and t.get("type") == "namespace" and t.get("name")
    ]


def _namespace_specs(tool: Mapping[str, Any], param: str) -> list[ToolSpec]:
    namespace, functions = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not namespace:
        raise invalid(f"{param}.name", "a namespace needs its name")
    if not isinstance(functions, list) or not functions:
        raise invalid(f"{param}.tools", "expected a non-empty list of function tools")
    specs = []
    for j, function in enumerate(functions):
        where = f"{param}.tools[{j}]"
        if not isinstance(function, Mapping) or function.get("type") != "function":
            raise unsupported(f"{where}.type", "a namespace holds function tools only")
        flat = {**function, "name": namespaced(namespace, str(function.get("name") or ""))}
        specs.append(_tool_spec(flat, where))
    return specs


def _tool_list(raw: list[Any], nested: bool) -> list[ToolSpec]:
    """``nested``: Chat Completions' ``{"type": "function", "function": {...}}``; else the
    Responses API's flat ``{"type": "function", "name": ...}``, where a ``namespace`` tool's
    functions are offered as plain ones."""
    specs = []
    for i, tool in enumerate(raw):
        param = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise invalid(param, "expected a tool object")
        if not nested and tool.get("type") == "namespace":
            specs.extend(_namespace_specs(tool, param))
            continue
        if tool.get("type") != "function":
            kind = tool.get("type")
            raise unsupported(
                f"{param}.type",
                f"{kind!r} tools are not supported: function tools only. "
                + HOSTED.get(str(kind), "No worker runs a provider's built-in tools."),
            )
        function = tool.get("function") if nested else tool
        specs.append(_tool_spec(function, f"{param}.function" if nested else param))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise invalid("tools", "two tools share a name")
    return specs


def _choice(raw: Any, names: list[str]) -> str:
    if raw is None:
        return "auto"
    if isinstance(raw, str):
        if raw not in CHOICES:
            expected = '"auto", "none", "required" or a function'
            raise invalid("tool_choice", f"expected {expected}, not {raw!r}")
        return raw
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        function = raw.get("function")
        name = function.get("name") if isinstance(function, Mapping) else raw.get("name")
        if name not in names:
            raise invalid("tool_choice", f"names no offered tool: {name!r}")
        return str(name)
    raise unsupported("tool_choice", "only auto, none, required or one function")


def tool_use(
    tools: list[Any] | None, choice: Any, parallel: bool | None, *, nested: bool
) -> ToolUse | None:
    """The tools offered and how they may be used; None when none are offered."""
    if not tools:
        if choice not in (None, "auto", "none"):
            raise invalid("tool_choice", 'with no tools, only "auto" or "none"')
        return None
    specs = _tool_list(tools, nested)
    choice = _choice(choice, [s.name for s in specs])
    return ToolUse(tools=tuple(specs), choice=choice, parallel=parallel)


def takes_tools(spec: WorkerSpec) -> bool:
    return spec.provider in TOOL_CALLING_PROVIDERS


def refuse_for_worker(spec: WorkerSpec, param: str) -> ApiError:
    return unsupported(
        param,
        f"worker {spec.name!r} ({spec.provider.value}) is not called with tools: function "
        f"calling goes to workers of providers {TOOL_WORKERS}",
    )


def chat_tool_calls(raw: Any, param: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` as Chat Completions sends them back."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid(param, "expected a list of tool calls")
    calls = []
    for i, call in enumerate(raw):
        where = f"{param}[{i}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise invalid(where, 'expected {"id", "type": "function", "function": {...}}')
        name, arguments = function.get("name"), function.get("arguments")
        calls.append(tool_call(call.get("id"), name, arguments, where))
    return tuple(calls)


def tool_call(ident: Any, name: Any, arguments: Any, param: str) -> ToolCall:
    if not isinstance(ident, str) or not ident:
        raise invalid(param, "a tool call needs its id")
    if not isinstance(name, str) or not name:
        raise invalid(param, "a tool call needs its function's name")
    if not isinstance(arguments, str):
        raise invalid(param, "a tool call's arguments are a JSON string")
    try:
        return ToolCall(id=ident, name=name, arguments=arguments)
    except ValidationError as exc:  # an id or name too long
        error = exc.errors()[0]
        raise invalid(f"{param}.{error['loc'][0]}", error["msg"]) from None


def describe_calls(calls: tuple[ToolCall, ...]) -> str:
    """Tool calls as a workflow's conversation shows them."""
    return "\n".join(f"[called {c.name}({c.arguments})]" for c in calls)


def chat_tool_calls_out(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A worker's calls as a ``chat.completion`` message carries them."""
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]
