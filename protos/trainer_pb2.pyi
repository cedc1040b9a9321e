from trainforge_protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperimentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPERIMENT_STATE_UNSPECIFIED: _ClassVar[ExperimentState]
    EXPERIMENT_RUNNING: _ClassVar[ExperimentState]
    EXPERIMENT_COMPLETED: _ClassVar[ExperimentState]
    EXPERIMENT_FAILED: _ClassVar[ExperimentState]
    EXPERIMENT_CANCELLED: _ClassVar[ExperimentState]
    EXPERIMENT_HALTED: _ClassVar[ExperimentState]
EXPERIMENT_STATE_UNSPECIFIED: ExperimentState
EXPERIMENT_RUNNING: ExperimentState
EXPERIMENT_COMPLETED: ExperimentState
EXPERIMENT_FAILED: ExperimentState
EXPERIMENT_CANCELLED: ExperimentState
EXPERIMENT_HALTED: ExperimentState

class WorkflowNode(_message.Message):
    __slots__ = ("name", "depends_on", "take", "experiment_id", "state", "reason", "best_trial", "skipped")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    TAKE_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BEST_TRIAL_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    name: str
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    take: str
    experiment_id: str
    state: ExperimentState
    reason: str
    best_trial: int
    skipped: bool
    def __init__(self, name: _Optional[str] = ..., depends_on: _Optional[_Iterable[str]] = ..., take: _Optional[str] = ..., experiment_id: _Optional[str] = ..., state: _Optional[_Union[ExperimentState, str]] = ..., reason: _Optional[str] = ..., best_trial: _Optional[int] = ..., skipped: _Optional[bool] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("id", "team", "name", "state", "reason", "nodes", "code_uri", "submitted_by", "created_at", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    team: str
    name: str
    state: ExperimentState
    reason: str
    nodes: _containers.RepeatedCompositeFieldContainer[WorkflowNode]
    code_uri: str
    submitted_by: str
    created_at: float
    updated_at: float
    def __init__(self, id: _Optional[str] = ..., team: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[ExperimentState, str]] = ..., reason: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[WorkflowNode, _Mapping]]] = ..., code_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ...) -> None: ...

class SubmitWorkflowRequest(_message.Message):
    __slots__ = ("team", "recipe", "code_uri", "submitted_by", "workflow_id")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    team: str
    recipe: str
    code_uri: str
    submitted_by: str
    workflow_id: str
    def __init__(self, team: _Optional[str] = ..., recipe: _Optional[str] = ..., code_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., workflow_id: _Optional[str] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("team", "workflow_id")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    team: str
    workflow_id: str
    def __init__(self, team: _Optional[str] = ..., workflow_id: _Optional[str] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("team", "limit")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    team: str
    limit: int
    def __init__(self, team: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows",)
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[Workflow]
    def __init__(self, workflows: _Optional[_Iterable[_Union[Workflow, _Mapping]]] = ...) -> None: ...

class WorkflowAction(_message.Message):
    __slots__ = ("team", "workflow_id", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    workflow_id: str
    actor: str
    def __init__(self, team: _Optional[str] = ..., workflow_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class Trial(_message.Message):
    __slots__ = ("index", "job_id", "state", "params_json", "objective", "stopped_at_rung", "rungs", "reason")
    class RungsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_RUNG_FIELD_NUMBER: _ClassVar[int]
    RUNGS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    job_id: str
    state: _common_pb2.JobState
    params_json: str
    objective: float
    stopped_at_rung: int
    rungs: _containers.ScalarMap[int, float]
    reason: str
    def __init__(self, index: _Optional[int] = ..., job_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., params_json: _Optional[str] = ..., objective: _Optional[float] = ..., stopped_at_rung: _Optional[int] = ..., rungs: _Optional[_Mapping[int, float]] = ..., reason: _Optional[str] = ...) -> None: ...

class Experiment(_message.Message):
    __slots__ = ("id", "team", "name", "state", "reason", "spec_json", "trials", "best_trial", "code_uri", "submitted_by", "created_at", "updated_at", "trial_count", "workflow_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    BEST_TRIAL_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    TRIAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    team: str
    name: str
    state: ExperimentState
    reason: str
    spec_json: str
    trials: _containers.RepeatedCompositeFieldContainer[Trial]
    best_trial: int
    code_uri: str
    submitted_by: str
    created_at: float
    updated_at: float
    trial_count: int
    workflow_id: str
    def __init__(self, id: _Optional[str] = ..., team: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[ExperimentState, str]] = ..., reason: _Optional[str] = ..., spec_json: _Optional[str] = ..., trials: _Optional[_Iterable[_Union[Trial, _Mapping]]] = ..., best_trial: _Optional[int] = ..., code_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., trial_count: _Optional[int] = ..., workflow_id: _Optional[str] = ...) -> None: ...

class SubmitExperimentRequest(_message.Message):
    __slots__ = ("team", "recipe", "code_uri", "submitted_by", "experiment_id")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    team: str
    recipe: str
    code_uri: str
    submitted_by: str
    experiment_id: str
    def __init__(self, team: _Optional[str] = ..., recipe: _Optional[str] = ..., code_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., experiment_id: _Optional[str] = ...) -> None: ...

class GetExperimentRequest(_message.Message):
    __slots__ = ("team", "experiment_id")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    team: str
    experiment_id: str
    def __init__(self, team: _Optional[str] = ..., experiment_id: _Optional[str] = ...) -> None: ...

class ListExperimentsRequest(_message.Message):
    __slots__ = ("team", "limit")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    team: str
    limit: int
    def __init__(self, team: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListExperimentsResponse(_message.Message):
    __slots__ = ("experiments",)
    EXPERIMENTS_FIELD_NUMBER: _ClassVar[int]
    experiments: _containers.RepeatedCompositeFieldContainer[Experiment]
    def __init__(self, experiments: _Optional[_Iterable[_Union[Experiment, _Mapping]]] = ...) -> None: ...

class ExperimentAction(_message.Message):
    __slots__ = ("team", "experiment_id", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    experiment_id: str
    actor: str
    def __init__(self, team: _Optional[str] = ..., experiment_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class Quota(_message.Message):
    __slots__ = ("gpus", "cpus", "memory", "jobs", "gpus_by_type", "cohort", "lending_limit", "borrowing_limit", "egress")
    class GpusByTypeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    GPUS_BY_TYPE_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    LENDING_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BORROWING_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    cpus: float
    memory: int
    jobs: int
    gpus_by_type: _containers.ScalarMap[str, int]
    cohort: str
    lending_limit: ResourceLimits
    borrowing_limit: ResourceLimits
    egress: str
    def __init__(self, gpus: _Optional[int] = ..., cpus: _Optional[float] = ..., memory: _Optional[int] = ..., jobs: _Optional[int] = ..., gpus_by_type: _Optional[_Mapping[str, int]] = ..., cohort: _Optional[str] = ..., lending_limit: _Optional[_Union[ResourceLimits, _Mapping]] = ..., borrowing_limit: _Optional[_Union[ResourceLimits, _Mapping]] = ..., egress: _Optional[str] = ...) -> None: ...

class ResourceLimits(_message.Message):
    __slots__ = ("gpus", "cpus", "memory")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    cpus: float
    memory: int
    def __init__(self, gpus: _Optional[int] = ..., cpus: _Optional[float] = ..., memory: _Optional[int] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("team", "quota", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    quota: Quota
    actor: str
    def __init__(self, team: _Optional[str] = ..., quota: _Optional[_Union[Quota, _Mapping]] = ..., actor: _Optional[str] = ...) -> None: ...

class GetTeamUsageRequest(_message.Message):
    __slots__ = ("team",)
    TEAM_FIELD_NUMBER: _ClassVar[int]
    team: str
    def __init__(self, team: _Optional[str] = ...) -> None: ...

class TeamUsage(_message.Message):
    __slots__ = ("team", "quota", "in_use", "queued_jobs", "active_jobs", "gpu_seconds", "cpu_seconds", "borrowed")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    team: str
    quota: Quota
    in_use: Quota
    queued_jobs: int
    active_jobs: int
    gpu_seconds: float
    cpu_seconds: float
    borrowed: Quota
    def __init__(self, team: _Optional[str] = ..., quota: _Optional[_Union[Quota, _Mapping]] = ..., in_use: _Optional[_Union[Quota, _Mapping]] = ..., queued_jobs: _Optional[int] = ..., active_jobs: _Optional[int] = ..., gpu_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., borrowed: _Optional[_Union[Quota, _Mapping]] = ...) -> None: ...

class ListUsageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Publication(_message.Message):
    __slots__ = ("prefix", "teams")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    teams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prefix: _Optional[str] = ..., teams: _Optional[_Iterable[str]] = ...) -> None: ...

class SetPublicationRequest(_message.Message):
    __slots__ = ("prefix", "teams", "actor")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    teams: _containers.RepeatedScalarFieldContainer[str]
    actor: str
    def __init__(self, prefix: _Optional[str] = ..., teams: _Optional[_Iterable[str]] = ..., actor: _Optional[str] = ...) -> None: ...

class ListPublicationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPublicationsResponse(_message.Message):
    __slots__ = ("publications",)
    PUBLICATIONS_FIELD_NUMBER: _ClassVar[int]
    publications: _containers.RepeatedCompositeFieldContainer[Publication]
    def __init__(self, publications: _Optional[_Iterable[_Union[Publication, _Mapping]]] = ...) -> None: ...

class ListUsageResponse(_message.Message):
    __slots__ = ("teams",)
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    teams: _containers.RepeatedCompositeFieldContainer[TeamUsage]
    def __init__(self, teams: _Optional[_Iterable[_Union[TeamUsage, _Mapping]]] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("backend", "unknown_reason", "capacity", "held", "active_jobs", "queued_jobs", "network_policy")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REASON_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    backend: str
    unknown_reason: str
    capacity: Quota
    held: Quota
    active_jobs: int
    queued_jobs: int
    network_policy: str
    def __init__(self, backend: _Optional[str] = ..., unknown_reason: _Optional[str] = ..., capacity: _Optional[_Union[Quota, _Mapping]] = ..., held: _Optional[_Union[Quota, _Mapping]] = ..., active_jobs: _Optional[int] = ..., queued_jobs: _Optional[int] = ..., network_policy: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("team", "manifest_json", "code_uri", "submitted_by", "job_id", "idempotency_key")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    team: str
    manifest_json: str
    code_uri: str
    submitted_by: str
    job_id: str
    idempotency_key: str
    def __init__(self, team: _Optional[str] = ..., manifest_json: _Optional[str] = ..., code_uri: _Optional[str] = ..., submitted_by: _Optional[str] = ..., job_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("team", "job_id")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    team: str
    job_id: str
    def __init__(self, team: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("team", "limit", "states", "name", "created_after", "created_before", "before_created_at", "before_id", "changed_after")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AFTER_FIELD_NUMBER: _ClassVar[int]
    team: str
    limit: int
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    name: str
    created_after: float
    created_before: float
    before_created_at: float
    before_id: str
    changed_after: float
    def __init__(self, team: _Optional[str] = ..., limit: _Optional[int] = ..., states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ..., name: _Optional[str] = ..., created_after: _Optional[float] = ..., created_before: _Optional[float] = ..., before_created_at: _Optional[float] = ..., before_id: _Optional[str] = ..., changed_after: _Optional[float] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "as_of")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Job]
    as_of: float
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.Job, _Mapping]]] = ..., as_of: _Optional[float] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("team", "job_id", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    job_id: str
    actor: str
    def __init__(self, team: _Optional[str] = ..., job_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class HaltJobRequest(_message.Message):
    __slots__ = ("team", "job_id", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    job_id: str
    actor: str
    def __init__(self, team: _Optional[str] = ..., job_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("team", "job_id", "actor")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    team: str
    job_id: str
    actor: str
    def __init__(self, team: _Optional[str] = ..., job_id: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class ReportJobStatusRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "reason", "actor", "learners", "outputs_uri", "checkpoint_step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_URI_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    state: _common_pb2.JobState
    reason: str
    actor: str
    learners: _containers.RepeatedCompositeFieldContainer[_common_pb2.LearnerStatus]
    outputs_uri: str
    checkpoint_step: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., learners: _Optional[_Iterable[_Union[_common_pb2.LearnerStatus, _Mapping]]] = ..., outputs_uri: _Optional[str] = ..., checkpoint_step: _Optional[int] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...
