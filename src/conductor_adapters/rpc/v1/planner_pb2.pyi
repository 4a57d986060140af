from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PriorRound(_message.Message):
    __slots__ = ("plan", "answers", "last_answer", "unanswered")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ANSWER_FIELD_NUMBER: _ClassVar[int]
    UNANSWERED_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    answers: _containers.RepeatedScalarFieldContainer[str]
    last_answer: str
    unanswered: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., answers: _Optional[_Iterable[str]] = ..., last_answer: _Optional[str] = ..., unanswered: _Optional[_Iterable[int]] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("question", "pool", "max_steps", "round", "prior", "temperature", "max_tokens", "fallback_model_id", "workflow_max_steps", "cost_weight")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PRIOR_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    COST_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    question: str
    pool: _containers.RepeatedCompositeFieldContainer[_common_pb2.PoolEntry]
    max_steps: int
    round: int
    prior: PriorRound
    temperature: float
    max_tokens: int
    fallback_model_id: int
    workflow_max_steps: int
    cost_weight: float
    def __init__(self, question: _Optional[str] = ..., pool: _Optional[_Iterable[_Union[_common_pb2.PoolEntry, _Mapping]]] = ..., max_steps: _Optional[int] = ..., round: _Optional[int] = ..., prior: _Optional[_Union[PriorRound, _Mapping]] = ..., temperature: _Optional[float] = ..., max_tokens: _Optional[int] = ..., fallback_model_id: _Optional[int] = ..., workflow_max_steps: _Optional[int] = ..., cost_weight: _Optional[float] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("call",)
    CALL_FIELD_NUMBER: _ClassVar[int]
    call: _common_pb2.PlannerCall
    def __init__(self, call: _Optional[_Union[_common_pb2.PlannerCall, _Mapping]] = ...) -> None: ...
