"""The planner service: renders the Conductor prompt, generates, parses and validates plans.

What other services may use is exported here: the planner itself, and the transformers backend
with its model resolution and loading (the trainer plans with the model it is training, exactly
as the planner serves a checkpoint). The backends and the gRPC server are this package's own.
"""

from conductor_planner.backends.transformers import TransformersPlannerBackend
from conductor_planner.models import (
    ModelSource,
    load_pretrained,
    prompt_form_of,
    resolve_model,
    write_prompt_form,
)
from conductor_planner.planner import ConductorPlanner, load_router

__all__ = [
    "ConductorPlanner",
    "ModelSource",
    "TransformersPlannerBackend",
    "load_pretrained",
    "load_router",
    "prompt_form_of",
    "resolve_model",
    "write_prompt_form",
]
