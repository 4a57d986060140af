"""Chat history in the shape Anthropic and Gemini ask for: system text apart, roles alternating."""

from __future__ import annotations

from collections.abc import Sequence

from conductor.chat import ChatMessage, Role


def system_and_turns(messages: Sequence[ChatMessage]) -> tuple[str | None, list[tuple[Role, str]]]:
    """The system messages joined, and the other turns with consecutive same-role turns merged.

    Both APIs take the system prompt outside the turn list and refuse (Anthropic) or mishandle
    (Gemini) two turns of one role in a row; one turn keeps both texts, a blank line apart.
    """
    system = [m.content for m in messages if m.role == "system"]
    turns: list[tuple[Role, str]] = []
    for message in messages:
        if message.role == "system":
            continue
        if turns and turns[-1][0] == message.role:
            turns[-1] = (message.role, f"{turns[-1][1]}\n\n{message.content}")
        else:
            turns.append((message.role, message.content))
    return ("\n\n".join(system) if system else None), turns
