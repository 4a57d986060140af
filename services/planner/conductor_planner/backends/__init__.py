"""Planner backends behind one interface (conductor.ports.PlannerBackend), chosen by settings.

``llamacpp`` and ``openai`` are here; ``transformers`` (trained checkpoints) and ``vllm``
(in-process GPU engine) plug into the same interface with the distributed runtime.
"""

from __future__ import annotations

import os

from conductor.errors import ConfigurationError
from conductor.ports import PlannerBackend
from conductor.settings import Settings

NOT_YET = {
    "transformers": "serves trained checkpoints; it arrives with the distributed planner",
    "vllm": "runs on a GPU; it arrives with the distributed planner",
}


def create_backend(settings: Settings) -> PlannerBackend:
    """The configured backend. A llamacpp backend loads its model here (blocking, ~1 s)."""
    name = settings.planner_backend
    if name == "llamacpp":
        from conductor.llamacpp import EngineOptions, get_engine
        from conductor_planner.backends.llamacpp import LlamaCppPlannerBackend

        model = settings.planner_model or settings.local_model
        return LlamaCppPlannerBackend(get_engine(model, EngineOptions.from_settings(settings)))
    if name == "openai":
        from conductor_planner.backends.openai import OpenAIPlannerBackend

        if not settings.planner_base_url or not settings.planner_model:
            raise ConfigurationError(
                "planner backend 'openai' needs CONDUCTOR_PLANNER_BASE_URL and "
                "CONDUCTOR_PLANNER_MODEL"
            )
        api_key = None
        if settings.planner_api_key_env:
            api_key = os.environ.get(settings.planner_api_key_env)
            if not api_key:
                raise ConfigurationError(
                    f"planner backend 'openai': {settings.planner_api_key_env} is not set"
                )
        return OpenAIPlannerBackend(
            base_url=settings.planner_base_url,
            model=settings.planner_model,
            api_key=api_key,
            structured=settings.planner_structured,
        )
    raise ConfigurationError(
        f"planner backend {name!r} is not available in this release: {NOT_YET[name]}. "
        "Use CONDUCTOR_PLANNER_BACKEND=llamacpp or openai."
    )
