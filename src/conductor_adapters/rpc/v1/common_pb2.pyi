import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttemptStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_STATUS_UNSPECIFIED: _ClassVar[AttemptStatus]
    ATTEMPT_STATUS_OK: _ClassVar[AttemptStatus]
    ATTEMPT_STATUS_ERROR: _ClassVar[AttemptStatus]

class StepKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_KIND_UNSPECIFIED: _ClassVar[StepKind]
    STEP_KIND_WORKER: _ClassVar[StepKind]
    STEP_KIND_CONDUCTOR: _ClassVar[StepKind]

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_PENDING: _ClassVar[StepStatus]
    STEP_STATUS_RUNNING: _ClassVar[StepStatus]
    STEP_STATUS_SUCCEEDED: _ClassVar[StepStatus]
    STEP_STATUS_FAILED: _ClassVar[StepStatus]
    STEP_STATUS_CANCELLED: _ClassVar[StepStatus]

class WorkflowStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKFLOW_STATUS_UNSPECIFIED: _ClassVar[WorkflowStatus]
    WORKFLOW_STATUS_QUEUED: _ClassVar[WorkflowStatus]
    WORKFLOW_STATUS_RUNNING: _ClassVar[WorkflowStatus]
    WORKFLOW_STATUS_COMPLETED: _ClassVar[WorkflowStatus]
    WORKFLOW_STATUS_FAILED: _ClassVar[WorkflowStatus]
    WORKFLOW_STATUS_CANCELLED: _ClassVar[WorkflowStatus]
ATTEMPT_STATUS_UNSPECIFIED: AttemptStatus
ATTEMPT_STATUS_OK: AttemptStatus
ATTEMPT_STATUS_ERROR: AttemptStatus
STEP_KIND_UNSPECIFIED: StepKind
STEP_KIND_WORKER: StepKind
STEP_KIND_CONDUCTOR: StepKind
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_PENDING: StepStatus
STEP_STATUS_RUNNING: StepStatus
STEP_STATUS_SUCCEEDED: StepStatus
STEP_STATUS_FAILED: StepStatus
STEP_STATUS_CANCELLED: StepStatus
WORKFLOW_STATUS_UNSPECIFIED: WorkflowStatus
WORKFLOW_STATUS_QUEUED: WorkflowStatus
WORKFLOW_STATUS_RUNNING: WorkflowStatus
WORKFLOW_STATUS_COMPLETED: WorkflowStatus
WORKFLOW_STATUS_FAILED: WorkflowStatus
WORKFLOW_STATUS_CANCELLED: WorkflowStatus

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("name", "provider", "model", "description", "available", "unavailable_reason", "input_price_per_million", "cached_input_price_per_million", "output_price_per_million")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    INPUT_PRICE_PER_MILLION_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_PRICE_PER_MILLION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PRICE_PER_MILLION_FIELD_NUMBER: _ClassVar[int]
    name: str
    provider: str
    model: str
    description: str
    available: bool
    unavailable_reason: str
    input_price_per_million: float
    cached_input_price_per_million: float
    output_price_per_million: float
    def __init__(self, name: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., description: _Optional[str] = ..., available: _Optional[bool] = ..., unavailable_reason: _Optional[str] = ..., input_price_per_million: _Optional[float] = ..., cached_input_price_per_million: _Optional[float] = ..., output_price_per_million: _Optional[float] = ...) -> None: ...

class PoolEntry(_message.Message):
    __slots__ = ("name", "description", "is_conductor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IS_CONDUCTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    is_conductor: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., is_conductor: _Optional[bool] = ...) -> None: ...

class AccessEntry(_message.Message):
    __slots__ = ("all", "step")
    ALL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    all: bool
    step: int
    def __init__(self, all: _Optional[bool] = ..., step: _Optional[int] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("model_id", "subtask", "access_list")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    SUBTASK_FIELD_NUMBER: _ClassVar[int]
    ACCESS_LIST_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    subtask: str
    access_list: _containers.RepeatedCompositeFieldContainer[AccessEntry]
    def __init__(self, model_id: _Optional[int] = ..., subtask: _Optional[str] = ..., access_list: _Optional[_Iterable[_Union[AccessEntry, _Mapping]]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("number", "status", "error_class", "error", "status_code", "usage", "cost_usd", "latency_ms", "started_at")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    number: int
    status: AttemptStatus
    error_class: str
    error: str
    status_code: int
    usage: Usage
    cost_usd: float
    latency_ms: float
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, number: _Optional[int] = ..., status: _Optional[_Union[AttemptStatus, str]] = ..., error_class: _Optional[str] = ..., error: _Optional[str] = ..., status_code: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cost_usd: _Optional[float] = ..., latency_ms: _Optional[float] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("index", "round", "kind", "worker", "subtask", "access_list", "visible_steps", "status", "output", "usage", "cost_usd", "latency_ms", "started_at", "finished_at", "error", "attempts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SUBTASK_FIELD_NUMBER: _ClassVar[int]
    ACCESS_LIST_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_STEPS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    round: int
    kind: StepKind
    worker: str
    subtask: str
    access_list: _containers.RepeatedCompositeFieldContainer[AccessEntry]
    visible_steps: _containers.RepeatedScalarFieldContainer[int]
    status: StepStatus
    output: str
    usage: Usage
    cost_usd: float
    latency_ms: float
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error: str
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    def __init__(self, index: _Optional[int] = ..., round: _Optional[int] = ..., kind: _Optional[_Union[StepKind, str]] = ..., worker: _Optional[str] = ..., subtask: _Optional[str] = ..., access_list: _Optional[_Iterable[_Union[AccessEntry, _Mapping]]] = ..., visible_steps: _Optional[_Iterable[int]] = ..., status: _Optional[_Union[StepStatus, str]] = ..., output: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cost_usd: _Optional[float] = ..., latency_ms: _Optional[float] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ...) -> None: ...

class PlannerCall(_message.Message):
    __slots__ = ("round", "raw_output", "valid", "errors", "plan", "stop", "pool", "usage", "cost_usd", "latency_ms", "backend")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RAW_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    round: int
    raw_output: str
    valid: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    plan: Plan
    stop: bool
    pool: _containers.RepeatedCompositeFieldContainer[PoolEntry]
    usage: Usage
    cost_usd: float
    latency_ms: float
    backend: str
    def __init__(self, round: _Optional[int] = ..., raw_output: _Optional[str] = ..., valid: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., stop: _Optional[bool] = ..., pool: _Optional[_Iterable[_Union[PoolEntry, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cost_usd: _Optional[float] = ..., latency_ms: _Optional[float] = ..., backend: _Optional[str] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("id", "variant", "question", "status", "planner_calls", "steps", "answer", "usage", "cost_usd", "latency_ms", "error", "created_at", "finished_at", "plan_valid", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PLANNER_CALLS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PLAN_VALID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    variant: str
    question: str
    status: WorkflowStatus
    planner_calls: _containers.RepeatedCompositeFieldContainer[PlannerCall]
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    answer: str
    usage: Usage
    cost_usd: float
    latency_ms: float
    error: str
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    plan_valid: bool
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., variant: _Optional[str] = ..., question: _Optional[str] = ..., status: _Optional[_Union[WorkflowStatus, str]] = ..., planner_calls: _Optional[_Iterable[_Union[PlannerCall, _Mapping]]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., answer: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cost_usd: _Optional[float] = ..., latency_ms: _Optional[float] = ..., error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., plan_valid: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...
