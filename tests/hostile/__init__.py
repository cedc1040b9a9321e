"""The hostile-learner suite: probes a learner script runs against the platform (probes.py)."""
