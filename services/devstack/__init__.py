"""The embedded stack: every server and service of the platform as local processes, for one machine.

`python -m trainforge_services.devstack up|down|status|bootstrap --state-dir DIR [--json]`
is what `trainforge up` / `trainforge down` / `trainforge admin bootstrap`
run as a subprocess (the CLI never imports the services). The pieces:

* `components`: what each component is, as data (a table in start order:
  etcd, mongo, logstore, trainer, lcm, api), and its environment, rendered
  from the services' settings classes.
* `procs`: the state directory (pid files, logs, `stack.json`, the lock) and
  finding a stack's processes by the TF_STACK_ID in their environment.
* `launcher`: `up` (idempotent), `down`, `status`, and the first API key
  (issued in process by the API's bootstrap function).

Nothing imports this package; it imports `trainforge_services.common` and the API's
bootstrap function only (import-linter contracts in pyproject.toml).
"""
