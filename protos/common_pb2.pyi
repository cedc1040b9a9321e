from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    PENDING: _ClassVar[JobState]
    QUEUED: _ClassVar[JobState]
    DEPLOYING: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    STORING: _ClassVar[JobState]
    COMPLETED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
    CANCELLED: _ClassVar[JobState]
    HALTING: _ClassVar[JobState]
    HALTED: _ClassVar[JobState]
    RESTARTING: _ClassVar[JobState]

class LearnerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEARNER_STATE_UNSPECIFIED: _ClassVar[LearnerState]
    LEARNER_PREPARING: _ClassVar[LearnerState]
    LEARNER_RUNNING: _ClassVar[LearnerState]
    LEARNER_STORING: _ClassVar[LearnerState]
    LEARNER_COMPLETED: _ClassVar[LearnerState]
    LEARNER_FAILED: _ClassVar[LearnerState]
    LEARNER_HALTING: _ClassVar[LearnerState]
    LEARNER_HALTED: _ClassVar[LearnerState]
JOB_STATE_UNSPECIFIED: JobState
PENDING: JobState
QUEUED: JobState
DEPLOYING: JobState
RUNNING: JobState
STORING: JobState
COMPLETED: JobState
FAILED: JobState
CANCELLED: JobState
HALTING: JobState
HALTED: JobState
RESTARTING: JobState
LEARNER_STATE_UNSPECIFIED: LearnerState
LEARNER_PREPARING: LearnerState
LEARNER_RUNNING: LearnerState
LEARNER_STORING: LearnerState
LEARNER_COMPLETED: LearnerState
LEARNER_FAILED: LearnerState
LEARNER_HALTING: LearnerState
LEARNER_HALTED: LearnerState

class Resources(_message.Message):
    __slots__ = ("gpus", "cpus", "memory")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    cpus: float
    memory: int
    def __init__(self, gpus: _Optional[int] = ..., cpus: _Optional[float] = ..., memory: _Optional[int] = ...) -> None: ...

class StatusEvent(_message.Message):
    __slots__ = ("from_state", "to_state", "reason", "actor", "timestamp", "borrowed", "grown")
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    GROWN_FIELD_NUMBER: _ClassVar[int]
    from_state: JobState
    to_state: JobState
    reason: str
    actor: str
    timestamp: float
    borrowed: Resources
    grown: Resources
    def __init__(self, from_state: _Optional[_Union[JobState, str]] = ..., to_state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., timestamp: _Optional[float] = ..., borrowed: _Optional[_Union[Resources, _Mapping]] = ..., grown: _Optional[_Union[Resources, _Mapping]] = ...) -> None: ...

class LearnerStatus(_message.Message):
    __slots__ = ("rank", "state", "exit_code", "attempt", "message", "isolation", "timed_out")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    rank: int
    state: LearnerState
    exit_code: int
    attempt: int
    message: str
    isolation: str
    timed_out: bool
    def __init__(self, rank: _Optional[int] = ..., state: _Optional[_Union[LearnerState, str]] = ..., exit_code: _Optional[int] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ..., isolation: _Optional[str] = ..., timed_out: _Optional[bool] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "team", "name", "state", "reason", "queue_position", "manifest_json", "code_uri", "attempt", "history", "learners", "created_at", "updated_at", "outputs_uri", "submitted_by", "restarts", "checkpoint_step", "not_before", "borrowed", "preemptions", "preempted")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    team: str
    name: str
    state: JobState
    reason: str
    queue_position: int
    manifest_json: str
    code_uri: str
    attempt: int
    history: _containers.RepeatedCompositeFieldContainer[StatusEvent]
    learners: _containers.RepeatedCompositeFieldContainer[LearnerStatus]
    created_at: float
    updated_at: float
    outputs_uri: str
    submitted_by: str
    restarts: int
    checkpoint_step: int
    not_before: float
    borrowed: Borrowed
    preemptions: int
    preempted: str
    def __init__(self, id: _Optional[str] = ..., team: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., queue_position: _Optional[int] = ..., manifest_json: _Optional[str] = ..., code_uri: _Optional[str] = ..., attempt: _Optional[int] = ..., history: _Optional[_Iterable[_Union[StatusEvent, _Mapping]]] = ..., learners: _Optional[_Iterable[_Union[LearnerStatus, _Mapping]]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., outputs_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., restarts: _Optional[int] = ..., checkpoint_step: _Optional[int] = ..., not_before: _Optional[float] = ..., borrowed: _Optional[_Union[Borrowed, _Mapping]] = ..., preemptions: _Optional[int] = ..., preempted: _Optional[str] = ...) -> None: ...

class Borrowed(_message.Message):
    __slots__ = ("cohort", "gpus", "cpus", "memory")
    COHORT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    cohort: str
    gpus: int
    cpus: float
    memory: int
    def __init__(self, cohort: _Optional[str] = ..., gpus: _Optional[int] = ..., cpus: _Optional[float] = ..., memory: _Optional[int] = ...) -> None: ...
