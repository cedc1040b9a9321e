"""One Trainer among several: every replica serves the gRPC API, one elected replica schedules.

With `TF_ELECT=1` each Trainer campaigns for `<prefix>/leaders/trainer` in
etcd (services/common/election.py). Every replica serves every RPC: a
submit, cancel, halt, resume or a monitor's report is a compare-and-set in
MongoDB whichever replica makes it, and the LCM calls its rules ask for
(halt, remove learners) are idempotent. What must run once runs only on
the leader:

- the dispatcher's admission passes (and the cleanup scan inside them),
  fenced by the leader's term in the store (services/trainer/fence.py);
- the restart reconciliation (`JobService.reconcile`), run at each takeover
  rather than at start: it resends the deploys and halts a dead leader may
  have left unsent;
- the experiment driver (its decisions are written before they are acted
  on, but two drivers could still halt a trial twice).

The webhook notifier runs on every replica: it claims each delivery with a
lease in MongoDB (services/common/webhooks.py), so two never send one.

A follower's submit wakes no dispatcher of its own; the leader's pass
every `TF_DISPATCH_INTERVAL` seconds picks the job up.
"""

from __future__ import annotations

import logging
import os
import socket

from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.election import Election
from trainforge_services.common.errors import message_of
from trainforge_services.common.settings import StoreSettings
from trainforge_services.trainer.dispatcher import Dispatcher
from trainforge_services.trainer.experiments.driver import ExperimentDriver
from trainforge_services.trainer.fence import Fence, FenceGate
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)

SERVICE = "trainer"


class Leadership:
    """Turns an election's outcome into the Trainer's singleton loops running here or not."""

    def __init__(self, coordinator: Coordinator, fence: Fence, gate: FenceGate, *, ttl: int, address: str):
        self._coord, self._fence, self.gate = coordinator, fence, gate
        self.identity = f"{socket.gethostname()}:{os.getpid()}@{address}"
        self.election = Election(coordinator, SERVICE, ttl=ttl, identity=self.identity,
                                 on_elected=self._elected, on_deposed=self._deposed)
        self._store: JobStore | None = None
        self._service: JobService | None = None
        self._dispatcher: Dispatcher | None = None

    def start(self, store: JobStore, service: JobService, dispatcher: Dispatcher,
              driver: ExperimentDriver | None) -> None:
        self._store, self._service, self._dispatcher = store, service, dispatcher
        if driver is not None:
            driver.active = lambda: self.gate.leading
        self.election.start()

    def stop(self) -> None:
        self.election.stop(resign=True)
        self._coord.close()

    def _elected(self, term: int) -> None:
        if self._store is None or self._service is None or self._dispatcher is None:
            return
        try:
            if not self._fence.take(term, self.identity):
                # the store knows a newer leader: this election is already stale
                log.warning("trainer: term %d is older than the store's fence %d; resigning", term,
                            self._fence.current())
                self.election.resign()
                return
            stamped = self._store.stamp_fence(term)
            self.gate.lead(term)
            log.info("trainer: leading as term %d (%d queued jobs fenced); reconciling", term, stamped)
            self._service.reconcile()
        except Exception as e:  # noqa: BLE001 - a leader that cannot lead must let another one try
            log.warning("trainer: could not take over as term %d: %s; resigning", term, message_of(e))
            self.gate.follow()
            self.election.resign()
            return
        self._dispatcher.wake()

    def _deposed(self) -> None:
        self.gate.follow()
        log.info("trainer: following; the elected replica dispatches")


def leadership(settings: StoreSettings, fence: Fence, *, ttl: int, address: str) -> Leadership:
    """A Trainer's campaign in the etcd `settings` name, fencing through `fence`."""
    return Leadership(Coordinator.of(settings), fence, FenceGate(fence), ttl=ttl, address=address)
