"""The planner service: renders the Conductor prompt, generates, parses and validates plans.

What other services may use is exported here: the planner itself, and the transformers backend
with its model resolution (the trainer plans with the model it is training, exactly as the
planner serves a checkpoint). The backends and the gRPC server are this package's own.
"""

from conductor_planner.backends.transformers import (
    ModelSource,
    TransformersPlannerBackend,
    resolve_model,
)
from conductor_planner.planner import ConductorPlanner

__all__ = ["ConductorPlanner", "ModelSource", "TransformersPlannerBackend", "resolve_model"]
