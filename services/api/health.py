"""Whether the API can serve: it needs the Trainer, the identity store and the log store.

Each component is checked on its own so a 503 says which one is missing;
`trainforge up` waits for this to turn 200 before it hands out a key.
"""

from __future__ import annotations

from collections.abc import Callable

from trainforge_services.api.identity import IdentityStore
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.errors import TrainforgeError


def _probe(check: Callable[[], object]) -> dict:
    try:
        check()
    except TrainforgeError as e:
        return {"status": "unavailable", "detail": e.message}
    except Exception as e:  # noqa: BLE001 - a health probe reports, it does not fail
        return {"status": "unavailable", "detail": f"{type(e).__name__}: {e}"}
    return {"status": "ok", "detail": ""}


def _logstore_ok(logs: LogStore) -> None:
    if not logs.healthy():
        raise TrainforgeError("log store does not answer")


def check(trainer: TrainerApi, identity: IdentityStore, logs: LogStore) -> tuple[bool, dict]:
    components = {
        "trainer": _probe(trainer.health),
        "mongo": _probe(identity.ping),
        "logstore": _probe(lambda: _logstore_ok(logs)),
    }
    ok = all(c["status"] == "ok" for c in components.values())
    return ok, {"status": "ok" if ok else "unavailable", "components": components}
