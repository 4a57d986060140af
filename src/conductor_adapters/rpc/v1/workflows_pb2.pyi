import datetime

from . import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CancelRequest(_message.Message):
    __slots__ = ("workflow_id",)
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    def __init__(self, workflow_id: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("question", "variant", "pool", "max_steps", "metadata", "cost_weight")
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
    question: str
    variant: str
    pool: _containers.RepeatedScalarFieldContainer[str]
    max_steps: int
    metadata: _containers.ScalarMap[str, str]
    cost_weight: float
    def __init__(self, question: _Optional[str] = ..., variant: _Optional[str] = ..., pool: _Optional[_Iterable[str]] = ..., max_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., cost_weight: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("workflow_id", "sequence", "at", "plan", "step_started", "step_finished", "completed", "failed", "cancelled")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEP_STARTED_FIELD_NUMBER: _ClassVar[int]
    STEP_FINISHED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    sequence: int
    at: _timestamp_pb2.Timestamp
    plan: _common_pb2.PlannerCall
    step_started: _common_pb2.Step
    step_finished: _common_pb2.Step
    completed: _common_pb2.Workflow
    failed: _common_pb2.Workflow
    cancelled: _common_pb2.Workflow
    def __init__(self, workflow_id: _Optional[str] = ..., sequence: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.PlannerCall, _Mapping]] = ..., step_started: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., step_finished: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., completed: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ..., failed: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ..., cancelled: _Optional[_Union[_common_pb2.Workflow, _Mapping]] = ...) -> None: ...
