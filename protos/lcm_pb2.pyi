from trainforge_protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeployJobRequest(_message.Message):
    __slots__ = ("job_id", "team", "attempt", "manifest_json", "code_uri", "checkpoint_uri", "secret_env", "team_quota", "gated", "reads")
    class SecretEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_URI_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    SECRET_ENV_FIELD_NUMBER: _ClassVar[int]
    TEAM_QUOTA_FIELD_NUMBER: _ClassVar[int]
    GATED_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    team: str
    attempt: int
    manifest_json: str
    code_uri: str
    checkpoint_uri: str
    secret_env: _containers.ScalarMap[str, str]
    team_quota: TeamQuota
    gated: bool
    reads: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., team: _Optional[str] = ..., attempt: _Optional[int] = ..., manifest_json: _Optional[str] = ..., code_uri: _Optional[str] = ..., checkpoint_uri: _Optional[str] = ..., secret_env: _Optional[_Mapping[str, str]] = ..., team_quota: _Optional[_Union[TeamQuota, _Mapping]] = ..., gated: _Optional[bool] = ..., reads: _Optional[_Iterable[str]] = ...) -> None: ...

class TeamQuota(_message.Message):
    __slots__ = ("gpus", "cpus", "memory", "jobs", "gpus_by_type", "egress")
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
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    cpus: float
    memory: int
    jobs: int
    gpus_by_type: _containers.ScalarMap[str, int]
    egress: str
    def __init__(self, gpus: _Optional[int] = ..., cpus: _Optional[float] = ..., memory: _Optional[int] = ..., jobs: _Optional[int] = ..., gpus_by_type: _Optional[_Mapping[str, int]] = ..., egress: _Optional[str] = ...) -> None: ...

class SyncTeamRequest(_message.Message):
    __slots__ = ("team", "quota")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    team: str
    quota: TeamQuota
    def __init__(self, team: _Optional[str] = ..., quota: _Optional[_Union[TeamQuota, _Mapping]] = ...) -> None: ...

class SyncTeamResponse(_message.Message):
    __slots__ = ("mirrored",)
    MIRRORED_FIELD_NUMBER: _ClassVar[int]
    mirrored: bool
    def __init__(self, mirrored: _Optional[bool] = ...) -> None: ...

class DeployJobResponse(_message.Message):
    __slots__ = ("handles",)
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, handles: _Optional[_Iterable[str]] = ...) -> None: ...

class KillJobRequest(_message.Message):
    __slots__ = ("job_id", "reason", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class LcmHaltJobRequest(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class LcmHaltJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenGateRequest(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class OpenGateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GrowJobRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "learners")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    learners: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., learners: _Optional[int] = ...) -> None: ...

class GrowJobResponse(_message.Message):
    __slots__ = ("granted",)
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    def __init__(self, granted: _Optional[bool] = ...) -> None: ...

class KillJobResponse(_message.Message):
    __slots__ = ("killed",)
    KILLED_FIELD_NUMBER: _ClassVar[int]
    killed: int
    def __init__(self, killed: _Optional[int] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Capacity(_message.Message):
    __slots__ = ("backend", "total", "max_learners", "network_policy")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_LEARNERS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    backend: str
    total: _common_pb2.Resources
    max_learners: int
    network_policy: str
    def __init__(self, backend: _Optional[str] = ..., total: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., max_learners: _Optional[int] = ..., network_policy: _Optional[str] = ...) -> None: ...

class LcmHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LcmHealthResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...
