"""conductor-mini's learned router: a model, not an adapter. Its file format (``model``), the
question's embedding and text features, fitting the router and its knn and cluster baselines
from arrays (``fitting``; the router's logistic or mlp head: ``heads``), the held-out report
(``report``) and serving (``serving``: the worker a question goes to).

It reads only the core, numpy and pydantic (scikit-learn and WordLlama where they are used:
the router extra). The planner and the evaluation serve it, the trainer fits it from evaluation
results and traces (and trains the mlp head's networks, in torch, for ``heads``); what they
may use is exported here, the modules are this package's own.
"""

from conductor_router.embedding import EMBEDDER_NAME, ROUTER_INSTALL, QuestionEmbedder
from conductor_router.fitting import embed_questions, fit_routers
from conductor_router.heads import HEAD_CHOICES, HeadChoice, MlpFitter, Progress
from conductor_router.model import (
    PER_QUESTIONS,
    ROUTER_FORMAT,
    HeadKind,
    MlpNetwork,
    MlpWeights,
    RouterModel,
    WorkerHead,
    load_router_model,
    save_router_model,
)
from conductor_router.packed_array import PackedArray
from conductor_router.report import curve_area, held_out_report
from conductor_router.serving import (
    Router,
    RoutingDecision,
    WorkerScore,
    known_mean,
    mlp_chances,
    mlp_logits,
)
from conductor_router.text_features import QUESTION_FEATURES, question_features

__all__ = [
    "EMBEDDER_NAME",
    "HEAD_CHOICES",
    "PER_QUESTIONS",
    "QUESTION_FEATURES",
    "ROUTER_FORMAT",
    "ROUTER_INSTALL",
    "HeadChoice",
    "HeadKind",
    "MlpFitter",
    "MlpNetwork",
    "MlpWeights",
    "PackedArray",
    "Progress",
    "QuestionEmbedder",
    "Router",
    "RouterModel",
    "RoutingDecision",
    "WorkerHead",
    "WorkerScore",
    "curve_area",
    "embed_questions",
    "fit_routers",
    "held_out_report",
    "known_mean",
    "load_router_model",
    "mlp_chances",
    "mlp_logits",
    "question_features",
    "save_router_model",
]
