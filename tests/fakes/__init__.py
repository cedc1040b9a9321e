"""Test doubles of the platform's parts (a backend, a coordinator, the Trainer), in memory, for tests that need one without its servers."""
