"""conductor-mini's learned router: a model, not an adapter. Its file format and serving
(``model``), the question's embedding and text features.

It reads only the core, numpy and pydantic (WordLlama where it is used: the router extra). The
planner and the evaluation serve it, the trainer fits it from evaluation results and traces;
what they may use is exported here, the modules are this package's own.
"""

from conductor_router.embedding import EMBEDDER_NAME, ROUTER_INSTALL, QuestionEmbedder
from conductor_router.model import (
    PER_QUESTIONS,
    ROUTER_FORMAT,
    HeadKind,
    Router,
    RouterModel,
    RoutingDecision,
    WorkerHead,
    WorkerScore,
    known_mean,
    load_router_model,
    save_router_model,
)
from conductor_router.packed_array import PackedArray
from conductor_router.text_features import QUESTION_FEATURES, question_features

__all__ = [
    "EMBEDDER_NAME",
    "PER_QUESTIONS",
    "QUESTION_FEATURES",
    "ROUTER_FORMAT",
    "ROUTER_INSTALL",
    "HeadKind",
    "PackedArray",
    "QuestionEmbedder",
    "Router",
    "RouterModel",
    "RoutingDecision",
    "WorkerHead",
    "WorkerScore",
    "known_mean",
    "load_router_model",
    "question_features",
    "save_router_model",
]
