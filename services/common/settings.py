"""Settings, one class per service, read from TF_* environment variables.

Nothing here runs at import: each service's `main()` builds its settings with
`XSettings()` and passes them down explicitly, so tests build their own.
Every field has a description and bounds; secrets have no usable default
outside dev mode.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainforge_services.common.destinations import parse_allow
from trainforge_services.common.egress import parse as parse_egress

DEV_JWT_SECRET = "dev-only-insecure-secret-change-me"  # noqa: S105 - refused outside dev mode


class _Base(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TF_", extra="ignore", frozen=True)

    def to_env(self) -> dict[str, str]:
        """Every field as the TF_* variable that reads it back, for a process started with these settings."""
        prefix = str(self.model_config.get("env_prefix", ""))
        env: dict[str, str] = {}
        for name, value in self.model_dump(mode="json").items():
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (list, dict)):
                text = json.dumps(value)  # pydantic-settings parses complex fields as JSON
            else:
                text = str(value)
            env[f"{prefix}{name}".upper()] = text
        return env


class StoreSettings(_Base):
    """Where the shared systems are. Every service reads these."""

    state_dir: Path = Field(Path.home() / ".trainforge", description="embedded stack state: pids, logs, data")
    dev_mode: bool = Field(False, description="allow insecure defaults (embedded stack only)")
    etcd_endpoints: str = Field("127.0.0.1:2379", description="host:port[,host:port...] of etcd")
    etcd_prefix: str = Field("/trainforge", description="key prefix of everything trainforge writes to etcd")
    etcd_user: str = Field("", description="etcd user this process logs in as (empty: etcd without authentication); "
                           "a job's controllers and monitor get their job's own (common/adapters/etcdauth.py)")
    etcd_password: str = Field("", repr=False, description="password of etcd_user")
    mongo_url: str = Field("mongodb://127.0.0.1:27017", description="MongoDB connection string")
    mongo_db: str = Field("trainforge", description="MongoDB database name")
    logstore_url: str = Field("http://127.0.0.1:9200", description="Elasticsearch/OpenSearch URL")
    logstore_index: str = Field("tf-logs", description="index holding learner log lines")
    objectstore_url: str = Field("", description="file:///dir or s3://bucket/prefix; default <state_dir>/objects")
    s3_endpoint: str = Field("", description="S3 endpoint URL (empty: AWS default)")
    s3_access_key: str = Field("", description="S3 access key id")
    s3_secret_key: str = Field("", description="S3 secret access key")
    s3_region: str = Field("us-east-1", description="S3 region")
    log_json: bool = Field(False, description="service logs as JSON lines carrying job, team and request ids")
    trainer_address: str = Field("127.0.0.1:50051", description="host:port of the Trainer gRPC server")
    lcm_address: str = Field("127.0.0.1:50052", description="host:port of the LCM gRPC server")
    listen_address: str = Field("", description="Trainer/LCM: host:port this replica serves on (empty: "
                                "trainer_address or lcm_address); other services reach the replicas through "
                                "those, which may list several: host:port,host:port")
    elect: bool = Field(False, description="Trainer/LCM: run as one of several replicas; the singleton loops "
                        "(dispatch, supervision) run only on the replica elected through etcd")
    leader_ttl: int = Field(5, ge=2, le=60, description="seconds the elected replica's etcd lease lives without "
                            "keepalive: a follower takes over about this long after the leader dies")
    service_token: str = Field("", description="API, Trainer, LCM: the bearer token the platform's services present "
                               "to the Trainer's and the LCM's gRPC, which refuse calls without it (common/rpcauth.py); "
                               "no job process holds it; required outside dev mode (dev mode: generated into "
                               "<state_dir>/service.token)")

    def objectstore(self) -> str:
        return self.objectstore_url or (self.state_dir / "objects").resolve().as_uri()

    def service_addresses(self) -> list[str]:
        """The addresses of the platform's own services these settings know (no webhook may target them)."""
        return [self.etcd_endpoints, self.mongo_url, self.logstore_url, self.s3_endpoint, self.trainer_address,
                self.lcm_address, self.listen_address]


_WEBHOOK_ALLOW = ("destinations webhooks may target although they are loopback, link-local or one of the "
                  "platform's own services: comma-separated host names, IPv4 addresses or CIDRs, [IPv6] "
                  "addresses or CIDRs, each with an optional :port (the platform's own services need the port), "
                  "e.g. hooks.internal,127.0.0.1:9000,10.1.0.0/16")


def _check_allow(v: str) -> str:
    parse_allow(v)
    return v


class ApiSettings(StoreSettings):
    api_host: str = Field("127.0.0.1", description="interface the REST API listens on")
    api_port: int = Field(8080, ge=0, le=65535, description="port of the REST API")
    jwt_secret: str = Field(DEV_JWT_SECRET, min_length=16, description="HMAC secret for dashboard JWTs")
    jwt_algorithms: list[str] = Field(["HS256"], description="accepted JWT algorithms (never taken from a token)")
    jwt_audience: str = Field("trainforge", description="required JWT aud")
    jwt_issuer: str = Field("trainforge", description="required JWT iss")
    max_upload_bytes: int = Field(256 * 2**20, ge=1024, description="largest code archive accepted")
    log_page_max: int = Field(5000, ge=1, le=10000, description="most log lines returned by one request")
    retention_interval: float = Field(3600.0, ge=0, le=7 * 86400, description="seconds between retention sweeps "
                                      "of logs, metrics and outputs (0: none)")
    jwt_lifetime: int = Field(3600, ge=60, le=86400, description="seconds a token from POST /v1/auth/token lives")
    rate_limit_per_second: float = Field(20.0, ge=0, le=1e6,
                                         description="requests per second one API key may make (0: no limit)")
    rate_limit_burst: int = Field(40, ge=1, le=1_000_000, description="requests one API key may make at once")
    rate_limit_shared: bool = Field(False, description="keep the per-key limits in MongoDB, one allowance across "
                                    "API replicas (default: in each process)")
    auth_cache_seconds: float = Field(1.0, ge=0, le=1.0, description="longest a successful key check is reused "
                                      "(a revoked key or disabled team is refused within it; 0: every request "
                                      "reads the store)")
    job_cache_seconds: float = Field(0.5, ge=0, le=1.0, description="longest a job read from the Trainer is "
                                     "reused by GET /v1/jobs/{id} in this process (a change is seen within it; "
                                     "0: every GET asks the Trainer)")
    secrets_key: str = Field("", description="Fernet key encrypting team secrets at rest; required outside dev "
                                          "mode (dev mode: generated into <state_dir>/secrets.key)")
    webhook_allow: str = Field("", description=_WEBHOOK_ALLOW)
    credentials_key: str = Field("", description="key each job's own credentials are derived from (common/jobcreds.py): "
                                 "the job gateway checks a controller's token with it; the LCM's and the Trainer's "
                                 "(dev mode: generated into <state_dir>/credentials.key; empty outside dev mode: "
                                 "no gateway)")

    _allow = field_validator("webhook_allow")(_check_allow)

    def service_addresses(self) -> list[str]:
        return [*super().service_addresses(), f"{self.api_host}:{self.api_port}"]

    @model_validator(mode="after")
    def _no_default_secret(self) -> ApiSettings:
        if not self.dev_mode and self.jwt_secret == DEV_JWT_SECRET:
            raise ValueError("TF_JWT_SECRET must be set outside dev mode (TF_DEV_MODE=1)")
        return self


class TrainerSettings(StoreSettings):
    dispatch_interval: float = Field(1.0, gt=0, le=60, description="seconds between queue passes")
    experiment_interval: float = Field(2.0, gt=0, le=60, description="longest wait between experiment-driver "
                                       "passes (a trial's state change wakes it sooner)")
    lcm_timeout: float = Field(30.0, gt=0, le=600, description="seconds an LCM call may take")
    webhook_max_tries: int = Field(8, ge=1, le=100, description="POSTs of one webhook delivery before it fails")
    webhook_backoff: float = Field(1.0, gt=0, le=3600, description="seconds before a failed delivery's first retry; "
                                   "later waits double, up to 300 times it")
    secrets_key: str = Field("", description="Fernet key encrypting team secrets at rest; required outside dev "
                                          "mode (dev mode: generated into <state_dir>/secrets.key)")
    credentials_key: str = Field("", description="key each job's own credentials are derived from (common/jobcreds.py); "
                                 "required outside dev mode (dev mode: generated into <state_dir>/credentials.key); "
                                 "the LCM and the Trainer must hold the same one")
    metrics_port: int = Field(-1, ge=-1, le=65535, description="port of the Prometheus /metrics endpoint "
                              "(-1: none, 0: any free port)")
    preempt_min_runtime: float = Field(60.0, ge=0, le=86400, description="seconds a job runs before the scheduler "
                                       "may halt it for a job of higher priority or its quota's owner")
    preempt_max_per_job: int = Field(3, ge=0, le=1000, description="most times one job is preempted (0: the "
                                     "scheduler never preempts)")
    webhook_allow: str = Field("", description=_WEBHOOK_ALLOW)
    credentials_key: str = Field("", description="key each job's own credentials are derived from (common/jobcreds.py): "
                                 "the job gateway checks a controller's token with it; the LCM's and the Trainer's "
                                 "(dev mode: generated into <state_dir>/credentials.key; empty outside dev mode: "
                                 "no gateway)")
    api_address: str = Field("", description="host:port[,host:port...] of the REST API as this network reaches it "
                             "(webhooks may not target it)")

    _allow = field_validator("webhook_allow")(_check_allow)

    def service_addresses(self) -> list[str]:
        metrics = [f"0.0.0.0:{self.metrics_port}"] if self.metrics_port > 0 else []
        return [*super().service_addresses(), self.api_address, *metrics]


class LcmSettings(StoreSettings):
    backend: str = Field("local", pattern="^(local|kubernetes|docker|simulated)$",
                         description="where learners run (simulated: no processes, for scale tests)")
    python: str = Field("", description="interpreter for controllers and monitors (default: this one)")
    local_cpus: float = Field(0, ge=0, description="CPU cores the local backend offers (0: all of the machine's)")
    local_memory: int = Field(0, ge=0, description="bytes the local backend offers (0: the machine's total)")
    local_gpus: int = Field(-1, ge=-1, description="GPUs the local backend offers (-1: detect)")
    local_max_learners: int = Field(64, ge=1, description="learners the local backend runs at once")
    fork_server: bool = Field(True, description="the local backend forks controllers and job monitors from a warm "
                              "server that has their imports done (false: a fresh interpreter each)")
    job_nice: int = Field(0, ge=0, le=19, description="the local backend's job monitors, controllers and learners "
                          "run at this nice (and their sessions' autogroups), below the control plane's 0 "
                          "(0, the default: the same priority; docs/FASTPATH.md, What bounds it, says why)")
    credentials_key: str = Field("", description="key each job's own credentials are derived from (common/jobcreds.py); "
                                 "required outside dev mode (dev mode: generated into <state_dir>/credentials.key); "
                                 "the LCM and the Trainer must hold the same one")
    gateway_url: str = Field("", description="the API's URL as a job's controllers reach it: with it, controllers get "
                             "their job's token for its gateway and no object-store or log-store access of their "
                             "own (the API must hold the same credentials_key)")
    # -- the simulated backend (scale tests only: services/lcm/backends/simulated.py) --
    sim_seconds: float = Field(5.0, ge=0, description="how long each simulated job runs before it completes")
    sim_max_learners: int = Field(1000, ge=1, description="learners the simulated backend runs at once")
    sim_cpus: float = Field(100000, ge=0, description="CPU cores the simulated backend offers")
    sim_memory: int = Field(2**50, ge=0, description="bytes the simulated backend offers")
    sim_gpus: int = Field(0, ge=0, description="GPUs the simulated backend offers")
    lease_ttl: int = Field(10, ge=2, le=300, description="seconds a learner's etcd lease lives without keepalive")
    killed_ttl: int = Field(3600, ge=60, description="seconds the LCM remembers the last attempt it killed of a job "
                            "(an etcd key under a lease): a deploy of that attempt resent within them starts nothing; "
                            "longer than any dispatcher retries a lost deploy")
    docker_url: str = Field("", description="the docker backend's engine, e.g. unix:///run/docker.sock (empty: DOCKER_HOST or the default socket)")
    docker_image: str = Field("trainforge/learner:bookworm", description="the docker backend's image for a manifest without `image:`")
    metrics_port: int = Field(-1, ge=-1, le=65535, description="port of the Prometheus /metrics endpoint "
                              "(-1: none, 0: any free port)")
    # -- the kubernetes backend (docs/KUBERNETES.md) --
    kube_config: str = Field("", description="kubeconfig file of the kubernetes backend (empty: the in-cluster "
                                             "service account)")
    kube_context: str = Field("", description="context in kube_config (empty: its current context)")
    kube_namespace_prefix: str = Field("tf-", pattern="^[a-z0-9-]{0,20}$",
                                       description="a team's namespace is this prefix + the team's name")
    kube_image: str = Field("trainforge/learner:torch", min_length=1,
                            description="learner image for a manifest without `image:` (it holds the platform)")
    kube_platform_image: str = Field("trainforge/platform:latest", min_length=1,
                                     description="image of the job monitor pods (the control-plane image)")
    kube_image_pull_policy: str = Field("IfNotPresent", pattern="^(Always|IfNotPresent|Never)$",
                                        description="imagePullPolicy of every pod the backend creates")
    kube_python: str = Field("python3", min_length=1,
                             description="interpreter the pods' injected entrypoint runs (in the image's PATH)")
    kube_pythonpath: str = Field("", description="PYTHONPATH given to pods (empty: the image's own)")
    kube_workdir: str = Field("/var/lib/trainforge/work", pattern="^/",
                              description="absolute directory of learner workdirs inside a pod (an emptyDir)")
    kube_gpu_type_label: str = Field("nvidia.com/gpu.product", min_length=1,
                                     description="node label a manifest's gpu_type selects on, unless "
                                                 "kube_gpu_node_selectors names the type")
    kube_gpu_node_selectors: dict[str, dict[str, str]] = Field(
        default_factory=dict, description='node selector per GPU type, e.g. {"a100": {"gpu": "a100-80g"}}')
    kube_gpu_tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="tolerations of pods that ask for GPUs (Kubernetes Toleration objects)")
    kube_master_addr: str = Field("", description="DDP rendezvous address given to learners (empty: rank 0's "
                                                  "DNS name under the attempt's headless Service)")
    kube_master_port: int = Field(29500, ge=1, le=65535, description="DDP rendezvous port (the first one)")
    kube_master_port_span: int = Field(0, ge=0, le=30000,
                                       description="ports above kube_master_port an attempt's rendezvous port is "
                                                   "hashed into (0: every attempt uses kube_master_port; pods "
                                                   "that share one network, like the test node's, need a span)")
    kube_platform_namespace: str = Field("trainforge", description="namespace of the control plane: learners' "
                                         "egress to it is allowed (etcd, trainer, log and object stores in-cluster)")
    kube_egress_cidrs: list[str] = Field(default_factory=list,
                                         description='platform endpoints outside the cluster learners may reach, '
                                                     'as "CIDR" or "CIDR:port", e.g. "10.0.3.4/32:2379"')
    kube_pending_timeout: float = Field(300.0, gt=0, le=86400,
                                        description="seconds a pod may stay unschedulable or unable to pull its "
                                                    "image before its learner counts as failed with that reason")
    kube_netpol_canary: float = Field(3600.0, ge=0, le=86400 * 30,
                                      description="the NetworkPolicy canary runs at LCM start and again when its "
                                                  "verdict, older than this many seconds, is asked for (0: never)")


class ControllerSettings(StoreSettings):
    log_batch_lines: int = Field(2000, ge=1, le=10000, description="most lines per shipped batch")
    log_drain_seconds: float = Field(30.0, ge=0, le=3600, description="longest the end of a run waits for the log "
                                     "store to take the rest of the log (the archive keeps every line regardless)")
    log_batch_seconds: float = Field(0.5, gt=0, le=30, description="longest a line waits before it is shipped")
    kill_grace: float = Field(10.0, ge=0, le=600, description="seconds between SIGTERM and SIGKILL")
    place_cpus: str = Field("output", pattern="^(off|output|all)$",
                            description="where the controller may use more CPUs than the job's resources.cpus: "
                                        "output (the default: the pipe readers, log splitter and shipper kept "
                                        "off the last ceil(cpus) CPUs, which are left to the learner), all (the "
                                        "learner pinned to those CPUs too; for hosts that run one job), or off")
    env_cache_dir: Path | None = Field(None, description="where per-job environments (manifest requirements:) "
                                                         "are built and cached (default <state_dir>/envs)")
    env_build_timeout: float = Field(1800.0, gt=0, le=86400,
                                     description="longest one environment may take to build")
    env_source_builds: bool = Field(False, description="let an environment build source distributions (their "
                                    "build code runs on the host with the controller's rights; default: wheels only)")
    job_nice: int = Field(0, ge=0, le=19, description="the nice this controller and its learner take at start "
                          "(the local backend passes its own TF_JOB_NICE; 0: unchanged)")
    gateway_url: str = Field("", description="the API's job gateway: with it, the object and log stores are "
                             "reached through it with job_token and job_ticket, never directly (granted by the LCM)")
    job_token: str = Field("", description="this job's token at the gateway (granted by the LCM)", repr=False)
    job_ticket: str = Field("", description="this job's signed team and reads at the gateway (granted by the LCM)")

    def env_cache(self) -> Path:
        return self.env_cache_dir or self.state_dir / "envs"
    isolation: str = Field("auto", pattern="^(auto|sandbox|none)$",
                           description="learner sandbox: sandbox (required), none, or auto (sandbox where the "
                                       "kernel and privileges allow it)")
    require_isolation: bool = Field(False, description="fail learners that would run without a sandbox")
    egress: str = Field("none", description="the most egress a sandboxed learner may get (a team's own policy "
                                            "narrows it): none, or items of store (the object store's S3 "
                                            "endpoint) and host:port, comma-separated")

    @field_validator("egress")
    @classmethod
    def _egress(cls, v: str) -> str:
        return str(parse_egress(v, "TF_EGRESS"))


class MonitorSettings(StoreSettings):
    report_retry_seconds: float = Field(1.0, gt=0, le=60, description="first wait before retrying a Trainer report; later waits double, up to 8 times it")
    lease_ttl: int = Field(10, ge=2, le=300, description="seconds the monitor's claim on its job lives")
    monitor_token: str = Field("", description="the job's own credential for its reports to the Trainer, granted "
                               "by the LCM (common/rpcauth.py)")
    job_nice: int = Field(0, ge=0, le=19, description="the nice this monitor takes at start (the local backend "
                          "passes its own TF_JOB_NICE; 0: unchanged)")
