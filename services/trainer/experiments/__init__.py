"""Experiments and workflows: sweeps whose trials are ordinary jobs, driven from the store by a Trainer thread.

`run_store.py` and `runs.py` (what experiments and workflows share, as runs of
many jobs: their documents' common fields and moves, their use cases' checks),
`store.py` (experiment documents), `asha.py` (early stopping, pure),
`metrics.py` (a trial's reported metrics), `driver.py` (the loop that submits,
stops, promotes and settles), `service.py` (the experiment use cases),
`workflow_store.py` and `workflows.py` (DAGs of experiments: documents, the
runner the driver's pass calls, the use cases), `wire.py` (the protos).
"""
