"""Two API replicas as production wires them, for the cache tests: one real Trainer (an idle LCM double, so
nothing runs) over the real MongoDB-wire store, and two apps built by `create_app` from settings alone for the
Trainer (so each wraps its gRPC client in the job read cache), each with its own identity store and auth cache,
on one database, each served over real HTTP."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from types import SimpleNamespace

import httpx

from tests.fakes.lcm import IdleLcm
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings, TrainerSettings
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.wiring import serve

AUTH_TTL = 1.0
JOB_TTL = 0.5


@contextlib.contextmanager
def replicas(mongo_server, mongo_db, logstore, tmp_path, unique, *, job_ttl: float = JOB_TTL,
             **api) -> Iterator[SimpleNamespace]:
    """`a` and `b`: SimpleNamespace(http, url, app, identity); `keys`/`h`: alpha's, beta's and ops' keys and
    their auth headers; `jobs`: the Trainer's collection."""
    collection = f"jobs_{unique}"
    trainer = serve(TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url,
                                    mongo_db=mongo_db.name, trainer_address="127.0.0.1:0", dispatch_interval=0.2),
                    lcm=IdleLcm(Usage(64, 256, 2**40, 64)), db=mongo_db, collection=collection)
    seed = IdentityStore(mongo_db, touch_interval=0)
    for team in ("alpha", "beta", "ops"):
        seed.create_team(team)
    keys = {"alpha": seed.issue_key("alpha", "a", Role.MEMBER), "beta": seed.issue_key("beta", "b", Role.MEMBER),
            "ops": seed.issue_key("ops", "root", Role.PLATFORM_ADMIN)}
    settings = ApiSettings(dev_mode=True, state_dir=tmp_path, trainer_address=trainer.address,
                           job_cache_seconds=job_ttl, auth_cache_seconds=AUTH_TTL, retention_interval=0, **api)
    try:
        with contextlib.ExitStack() as stack:
            sides = []
            for name in ("a", "b"):
                identity = IdentityStore(mongo_db, cache_seconds=AUTH_TTL, touch_interval=0)
                app = create_app(settings, identity=identity, logs=logstore,
                                 objects=LocalStore(tmp_path / "objects"))
                url = stack.enter_context(serve_app(app))
                http = stack.enter_context(httpx.Client(base_url=url, timeout=30))
                sides.append(SimpleNamespace(name=name, http=http, url=url, app=app, identity=identity))
            yield SimpleNamespace(a=sides[0], b=sides[1], keys=keys, jobs=mongo_db[collection], seed=seed,
                                  h={k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()})
    finally:
        trainer.stop(0)


def submit(side, headers: dict, name: str = "cached") -> dict:
    manifest = {"name": name, "framework": "custom", "command": "true", "resources": {"cpus": 0.5}}
    resp = side.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=headers)
    assert resp.status_code == 201, resp.text
    return resp.json()
