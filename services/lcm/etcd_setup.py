"""Set up an etcd for trainforge: `python -m trainforge_services.lcm.etcd_setup` (an operator, or the Helm chart's
setup Job). It makes etcd's root user, the Trainer's and the LCM's users and roles, and turns authentication on.
Running it again is harmless: it sets each service's password again (a new one takes effect at once).

It reads TF_ETCD_ENDPOINTS, TF_ETCD_PREFIX, TF_ETCD_ROOT_PASSWORD and, for each service, TF_ETCD_TRAINER_USER /
TF_ETCD_TRAINER_PASSWORD and TF_ETCD_LCM_USER / TF_ETCD_LCM_PASSWORD. The Trainer's role reads and writes
`<prefix>/leaders/` (its election); the LCM's user gets etcd's root role, the one that may mint each job's user.
"""

from __future__ import annotations

import os
import sys

from trainforge_services.common.adapters import etcdauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.errors import TrainforgeError


def main(environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    names = ("TF_ETCD_ROOT_PASSWORD", "TF_ETCD_TRAINER_USER", "TF_ETCD_TRAINER_PASSWORD", "TF_ETCD_LCM_USER",
             "TF_ETCD_LCM_PASSWORD")
    missing = [n for n in names if not env.get(n)]
    if missing:
        print(f"etcd setup: set {', '.join(missing)}", file=sys.stderr)
        return 2
    endpoints, prefix = env.get("TF_ETCD_ENDPOINTS", "127.0.0.1:2379"), env.get("TF_ETCD_PREFIX", "/trainforge")
    root = Coordinator(endpoints, prefix, user=etcdauth.ROOT, password=env["TF_ETCD_ROOT_PASSWORD"])
    users = [etcdauth.ServiceUser(env["TF_ETCD_TRAINER_USER"], env["TF_ETCD_TRAINER_PASSWORD"],
                                  (f"{root.keys.prefix}/leaders/",)),
             etcdauth.ServiceUser(env["TF_ETCD_LCM_USER"], env["TF_ETCD_LCM_PASSWORD"], root=True)]
    try:
        etcdauth.setup(root.admin(), env["TF_ETCD_ROOT_PASSWORD"], users, enabled=root.login())
    except TrainforgeError as e:
        print(f"etcd setup at {endpoints}: {e}", file=sys.stderr)
        return 1
    finally:
        root.close()
    print(f"etcd at {endpoints}: authentication on; users root, {users[0].user}, {users[1].user}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
