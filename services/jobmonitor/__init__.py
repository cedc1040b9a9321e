"""The job monitor: one process per job attempt that aggregates learner states for the Trainer."""
