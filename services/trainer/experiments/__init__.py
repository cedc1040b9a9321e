"""Experiments: parameter sweeps whose trials are ordinary jobs, driven from the store by a Trainer thread.

`store.py` (the experiment documents), `asha.py` (early stopping, pure),
`metrics.py` (a trial's reported metrics), `driver.py` (the loop that submits,
stops, promotes and settles), `service.py` (the use cases behind the RPCs).
"""
