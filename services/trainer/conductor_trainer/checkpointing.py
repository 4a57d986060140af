"""Activation checkpointing on a model: whether it is on, and turning it on or off.

transformers 5 renamed gradient checkpointing to activation checkpointing; both names are
handled here, and a peft model is asked through its base model.
"""

from __future__ import annotations

from typing import Any


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _prefix(model: Any) -> str:
    return "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"


def checkpointing_is_on(model: Any) -> bool:
    base = _base(model)
    return bool(getattr(base, f"is_{_prefix(base)}_checkpointing", False))


def set_checkpointing(model: Any, on: bool, kwargs: dict[str, Any] | None = None) -> None:
    base = _base(model)
    if on:
        getattr(base, f"{_prefix(base)}_checkpointing_enable")(kwargs)
    else:
        getattr(base, f"{_prefix(base)}_checkpointing_disable")()
