import datetime

from . import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListRequest(_message.Message):
    __slots__ = ("status", "variant", "labels", "created_after", "created_before", "limit", "after")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.WorkflowStatus
    variant: str
    labels: _containers.ScalarMap[str, str]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    limit: int
    after: str
    def __init__(self, status: _Optional[_Union[_common_pb2.WorkflowStatus, str]] = ..., variant: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class WorkflowSummary(_message.Message):
    __slots__ = ("id", "status", "variant", "question", "metadata", "error", "usage", "cost_usd", "latency_ms", "created_at", "finished_at")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: _common_pb2.WorkflowStatus
    variant: str
    question: str
    metadata: _containers.ScalarMap[str, str]
    error: str
    usage: _common_pb2.Usage
    cost_usd: float
    latency_ms: float
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.WorkflowStatus, str]] = ..., variant: _Optional[str] = ..., question: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., error: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., cost_usd: _Optional[float] = ..., latency_ms: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("workflows", "has_more")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[WorkflowSummary]
    has_more: bool
    def __init__(self, workflows: _Optional[_Iterable[_Union[WorkflowSummary, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("workflow_id",)
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    def __init__(self, workflow_id: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("question", "variant", "pool", "max_steps", "metadata", "cost_weight", "stream_answer")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COST_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STREAM_ANSWER_FIELD_NUMBER: _ClassVar[int]
    question: str
    variant: str
    pool: _containers.RepeatedScalarFieldContainer[str]
    max_steps: int
    metadata: _containers.ScalarMap[str, str]
    cost_weight: float
    stream_answer: bool
    def __init__(self, question: _Optional[str] = ..., variant: _Optional[str] = ..., pool: _Optional[_Iterable[str]] = ..., max_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., cost_weight: _Optional[float] = ..., stream_answer: _Optional[bool] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("workflow_id", "status")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    status: _common_pb2.WorkflowStatus
    def __init__(self, workflow_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.WorkflowStatus, str]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("workflow_id",)
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    def __init__(self, workflow_id: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("workflow_id", "after_sequence")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    after_sequence: int
    def __init__(self, workflow_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WorkflowEvent(_message.Message):
    __slots__ = ("workflow_id", "sequence", "at", "plan", "step_started", "step_finished", "completed", "failed", "cancelled", "answer_delta")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEP_STARTED_FIELD_NUMBER: _ClassVar[int]
    STEP_FINISHED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_DELTA_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    sequence: int
    at: _timestamp_pb2.Timestamp
    plan: _common_pb2.PlannerCall
    step_started: _common_pb2.Step
    step_finished: _common_pb2.Step
    completed: _common_pb2.Workflow
    failed: _common_pb2.Workflow
    cancelled: _common_pb2.Workflow
    answer_delta: AnswerDelta
    def __init__(self, workflow_id: _Optional[str] = ..., sequence: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.PlannerCall, _Mapping]] = ..., step_started: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., step_finished: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., completed: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ..., failed: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ..., cancelled: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ..., answer_delta: _Optional[_Union[AnswerDelta, _Mapping]] = ...) -> None: ...

class AnswerDelta(_message.Message):
    __slots__ = ("text", "offset")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    text: str
    offset: int
    def __init__(self, text: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...
