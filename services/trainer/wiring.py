"""Assembles a Trainer from settings: store, LCM client, the job core, gRPC server.

The job core is wired in two steps, because the rules and their actions
depend on each other (services/trainer/rules.py): `wire` builds the
`LcmCalls` (the rules' `Actions`: the LCM calls a transition asks for),
then the rules' `Lifecycle` over them, then the `Dispatcher` (the admission
passes), and last binds the lifecycle and the dispatcher's wake-up to the
calls. `build` hands the same lifecycle and calls to the `JobService`.

`build` wires the parts and binds the port without starting anything, so a
test can hand in a fake LCM or its own database (a test of the job core
alone calls `wire`); `Trainer.start` brings the job store up to date
(indexes, restart reconciliation) before the first request or dispatch
pass; `Trainer.stop` stops taking requests first, then the dispatcher and
the LCM calls, then closes connections.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry

from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import destinations, jobcreds, rpc, rpcauth
from trainforge_services.common.adapters.mongo import Database, connect
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.observability import (
    CounterCollector,
    GaugeCollector,
    MetricsEndpoint,
    add_health,
    service_registry,
)
from trainforge_services.common.secrets import SecretBox, SecretStore, load_key
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.common.states import JobState
from trainforge_services.common.webhooks import Outbox, TeamWebhooks
from trainforge_services.trainer.dispatcher import ADMISSIONS, SPACING, Dispatcher
from trainforge_services.trainer.experiments.driver import ExperimentDriver, TrialChanged
from trainforge_services.trainer.experiments.metrics import LogStoreMetrics, MetricsReader
from trainforge_services.trainer.experiments.service import ExperimentService
from trainforge_services.trainer.experiments.store import COLLECTION as EXPERIMENT_COLLECTION
from trainforge_services.trainer.experiments.store import ExperimentStore
from trainforge_services.trainer.experiments.workflow_store import COLLECTION as WORKFLOW_COLLECTION
from trainforge_services.trainer.experiments.workflow_store import WorkflowStore
from trainforge_services.trainer.experiments.workflows import WorkflowRunner, WorkflowService
from trainforge_services.trainer.fence import Fence, FenceGate
from trainforge_services.trainer.grpc_api import TrainerServicer
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.lcm_client import GrpcLcm, Lcm
from trainforge_services.trainer.lcmcalls import LcmCalls
from trainforge_services.trainer.notifier import ANNOUNCED, RECONCILE_WINDOW, Notifier
from trainforge_services.trainer.preemption import Policy
from trainforge_services.trainer.quotas import COLLECTION as QUOTA_COLLECTION
from trainforge_services.trainer.quotas import QUOTA_MAX_AGE, QuotaStore
from trainforge_services.trainer.replicas import Leadership, leadership
from trainforge_services.trainer.rules import DEFAULT_RULES, Announce, Lifecycle, Rule
from trainforge_services.trainer.secret_env import ResolvingLcm
from trainforge_services.trainer.store import COLLECTION, JobStore
from trainforge_services.trainer.storerefs import Publications, StoreOwners, StoreRefs

log = logging.getLogger(__name__)
# the one RPC a job's monitor makes, with its own credential (common/rpcauth.py)
REPORT_METHOD = f"/{trainer_pb2.DESCRIPTOR.services_by_name['Trainer'].full_name}/ReportJobStatus"


@dataclass
class Core:
    """The Trainer's job core, wired: the rules' lifecycle, the LCM calls it acts through, and the dispatcher."""

    lifecycle: Lifecycle
    calls: LcmCalls
    dispatcher: Dispatcher

    def stop(self, timeout: float = 10.0) -> None:
        self.dispatcher.stop(timeout)  # its last reservations are written; their deploys go to the calls
        self.calls.stop()


def wire(store: JobStore, lcm: Lcm, *, rules: Sequence[Rule] = DEFAULT_RULES, quotas: QuotaStore | None = None,
         interval: float = 1.0, spacing: float = SPACING, kill_attempts: int = 4, kill_backoff: float = 0.5,
         workers: int = 8, preemption: Policy | None = None, gate: FenceGate | None = None) -> Core:
    """The job core over `store` and `lcm`, not yet started (`core.dispatcher.start()`)."""
    calls = LcmCalls(store, lcm, kill_attempts=kill_attempts, kill_backoff=kill_backoff, workers=workers)
    lifecycle = Lifecycle(store, calls, rules)
    dispatcher = Dispatcher(store, lcm, lifecycle, calls, quotas=quotas, interval=interval, spacing=spacing,
                            preemption=preemption, gate=gate)
    calls.bind(lifecycle, wake=dispatcher.wake)
    return Core(lifecycle, calls, dispatcher)


@dataclass
class Trainer:
    server: grpc.Server
    port: int
    host: str
    store: JobStore
    core: Core
    service: JobService
    _closers: list[Callable[[], None]] = field(default_factory=list)
    notifier: Notifier | None = None
    metrics_port: int = -1  # where /metrics is served once started (-1: not served)
    _metrics: MetricsEndpoint | None = None
    experiments: ExperimentStore | None = None
    driver: ExperimentDriver | None = None
    workflows: WorkflowStore | None = None
    # one replica among several (TF_ELECT): the singleton loops run while elected (replicas.py)
    leadership: Leadership | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def dispatcher(self) -> Dispatcher:
        return self.core.dispatcher

    def start(self) -> Trainer:
        try:
            self.store.ensure_indexes()
            if self.experiments is not None:
                self.experiments.ensure_indexes()
            if self.workflows is not None:
                self.workflows.ensure_indexes()
            if self.leadership is None:  # a replica reconciles when it is elected
                self.service.reconcile()
        except Unavailable:
            self.stop(grace=0)
            raise
        self.dispatcher.start()
        if self.driver is not None:
            self.driver.start()
        if self.notifier is not None:
            self.notifier.start()
            self._reconcile_notifications()
        self.server.start()
        if self.leadership is not None:
            self.leadership.start(self.store, self.service, self.dispatcher, self.driver)
        if self.metrics_port >= 0:
            self._metrics = MetricsEndpoint(trainer_registry(self.store), self.metrics_port, self.host)
            self.metrics_port = self._metrics.port
        log.info("trainer serving on %s", self.address)
        return self

    def _reconcile_notifications(self) -> None:
        """Queue again what a Trainer that died between a commit and its enqueue would have lost."""
        try:
            ended = self.store.in_states(ANNOUNCED, fields=["updated_at"])
            cutoff = time.time() - RECONCILE_WINDOW
            jobs = [self.store.find(j.id) for j in ended if j.updated_at >= cutoff]
            self.notifier.reconcile([j for j in jobs if j is not None])
        except Unavailable as e:
            log.warning("could not reconcile webhook notifications: %s", e.message)

    def stop(self, grace: float = 5.0) -> None:
        if self._metrics is not None:
            self._metrics.stop()
        self.server.stop(grace).wait()
        if self.leadership is not None:
            self.leadership.stop()
        if self.driver is not None:
            self.driver.stop()
        self.core.stop()
        if self.notifier is not None:
            self.notifier.stop()
        for close in self._closers:
            close()
        log.info("trainer stopped")


def build(settings: TrainerSettings, *, lcm: Lcm | None = None, db: Database | None = None,
          collection: str = COLLECTION, quota_collection: str = QUOTA_COLLECTION,
          metrics: MetricsReader | None = None, experiment_collection: str = EXPERIMENT_COLLECTION) -> Trainer:
    """A Trainer bound to `settings.trainer_address` (port 0 picks a free one), not yet started."""
    # its callers' credentials are checked before anything starts: without them (outside dev mode) none could call
    auth = server_auth(settings)
    closers: list[Callable[[], None]] = []
    if db is None:
        db = connect(settings.mongo_url, settings.mongo_db)
        closers.append(db.client.close)
    quotas = QuotaStore(db, quota_collection, max_age=QUOTA_MAX_AGE)
    if lcm is None:
        # every deploy carries the team's current quota (a kubernetes LCM mirrors it into the team's namespace)
        grpc_lcm = GrpcLcm(settings.lcm_address, timeout=settings.lcm_timeout, quota_of=quotas.get,
                           authorization=rpcauth.service_authorization(settings))
        closers.append(grpc_lcm.close)
        lcm = grpc_lcm
    # the key is checked before anything else starts: without one (outside dev mode) no secret could be read
    key = load_key(settings.secrets_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    box = SecretBox(key)
    # a test that names its own experiment collection gets its own workflow collection beside it
    workflow_collection = (WORKFLOW_COLLECTION if experiment_collection == EXPERIMENT_COLLECTION
                           else f"{experiment_collection}_workflows")
    refs = StoreRefs(StoreOwners(db, jobs=collection, experiments=experiment_collection,
                                 workflows=workflow_collection), Publications(db))
    lcm = ResolvingLcm(lcm, SecretStore(db, box).reveal, refs.reads)
    store = JobStore(db, collection)
    notifier = Notifier(Outbox(db), TeamWebhooks(db, box), max_tries=settings.webhook_max_tries,
                        initial_backoff=settings.webhook_backoff,
                        policy=destinations.policy(settings.webhook_allow, settings.service_addresses()))
    experiments_wake = threading.Event()
    trial_changed = TrialChanged(experiments_wake)
    listen = settings.listen_address or settings.trainer_address
    lead = (leadership(settings, Fence(db, "dispatcher"),
                       ttl=settings.leader_ttl, address=listen) if settings.elect else None)
    core = wire(store, lcm, rules=(*DEFAULT_RULES, Announce(notifier.enqueue), trial_changed), quotas=quotas,
                interval=settings.dispatch_interval, gate=lead.gate if lead is not None else None,
                preemption=Policy(settings.preempt_min_runtime, settings.preempt_max_per_job))
    service = JobService(store, core.lifecycle, core.calls, core.dispatcher, quotas, refs)
    if metrics is None:
        reader = LogStoreMetrics(settings.logstore_url, settings.logstore_index,
                                 objects=functools.cache(lambda: store_from_settings(settings)))
        closers.append(reader.close)
        metrics = reader
    experiments = ExperimentStore(db, experiment_collection)
    driver = ExperimentDriver(experiments, store, service, metrics, interval=settings.experiment_interval,
                              wake=experiments_wake)
    trial_changed.hand_over = driver.hand_over  # a freed slot goes to the held trial in the transition that freed it
    experiment_service = ExperimentService(experiments, store, service, driver)
    workflow_store = WorkflowStore(db, workflow_collection)
    driver.workflows = WorkflowRunner(workflow_store, experiment_service)
    workflow_service = WorkflowService(workflow_store, experiment_service, driver.wake)
    server, port = rpc.make_server(listen, auth=auth)
    trainer_pb2_grpc.add_TrainerServicer_to_server(TrainerServicer(service, experiment_service, workflow_service), server)
    add_health(server, ["trainforge.Trainer"])
    host = listen.rsplit(":", 1)[0]
    return Trainer(server, port, host, store, core, service, closers, notifier,
                   metrics_port=settings.metrics_port, experiments=experiments, driver=driver,
                   workflows=workflow_store, leadership=lead)


def server_auth(settings: TrainerSettings) -> rpcauth.ServerAuth:
    """Who may call the Trainer: the platform's services, and a job's monitor for that job's own reports."""
    token = rpcauth.load_service_token(settings.service_token, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    key = jobcreds.load_key(settings.credentials_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    return rpcauth.ServerAuth(token, key, {REPORT_METHOD: jobcreds.MONITOR})


def trainer_registry(store: JobStore) -> CollectorRegistry:
    """RPC figures, admission decisions, and per team its queue depth and jobs by state (read when scraped)."""
    def jobs_by_state() -> list[tuple[list[str], float]]:
        counts = collections.Counter((r.team, JobState(r.state).name.lower()) for r in store.usage_rows())
        return [([team, state], n) for (team, state), n in sorted(counts.items())]

    def queue_depth() -> list[tuple[list[str], float]]:
        rows = jobs_by_state()
        teams = sorted({labels[0] for labels, _ in rows})
        queued = {labels[0]: n for labels, n in rows if labels[1] == "queued"}
        return [([team], queued.get(team, 0)) for team in teams]

    return service_registry({"server": rpc.SERVER_STATS, "client": rpc.CLIENT_STATS}, [
        GaugeCollector("trainforge_jobs", "jobs by team and state", ["team", "state"], jobs_by_state),
        GaugeCollector("trainforge_queue_depth", "queued jobs per team", ["team"], queue_depth),
        CounterCollector("trainforge_admission_decisions", "admission pass decisions, per job and pass",
                         ["decision", "reason"], ADMISSIONS.snapshot),
    ])


def serve(settings: TrainerSettings, *, lcm: Lcm | None = None, db: Database | None = None,
          collection: str = COLLECTION, quota_collection: str = QUOTA_COLLECTION,
          metrics: MetricsReader | None = None, experiment_collection: str = EXPERIMENT_COLLECTION) -> Trainer:
    """A running Trainer; `.server`, `.port` and `.address` say where, `.stop()` ends it."""
    return build(settings, lcm=lcm, db=db, collection=collection, quota_collection=quota_collection,
                 metrics=metrics, experiment_collection=experiment_collection).start()
