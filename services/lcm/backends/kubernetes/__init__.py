"""The kubernetes backend (`TF_BACKEND=kubernetes`): attempts as pods in per-team namespaces (docs/KUBERNETES.md).

`backend.py` is the Backend; `naming.py`, `team.py` and `pods.py` build objects (pure); `status.py` reads pods;
`entry.py` is the entrypoint injected into every pod. Nothing is imported here, so the pods' entrypoint does not
load the LCM's kubernetes client.
"""
