"""tests/engine.py's data roots: the engine cache is shared by every clone on the machine, so a second test run
takes the next free data root instead of waiting for the first."""

from __future__ import annotations

import os

import pytest

from tests.engine import DATA_ROOTS, EngineUnavailable, lock_data_root


def test_runs_at_once_take_the_free_data_roots_in_turn_then_wait_for_the_first(tmp_path):
    held = [lock_data_root(tmp_path, wait=0) for _ in range(DATA_ROOTS)]
    try:
        assert [name for _, name in held] == ["data"] + [f"data-{i}" for i in range(1, DATA_ROOTS)]
        with pytest.raises(EngineUnavailable, match=r"data roots .* are in use by other test runs .*pid"):
            lock_data_root(tmp_path, wait=0.2)
        os.close(held[0][0])
        fd, name = lock_data_root(tmp_path, wait=2)
        assert name == "data"
        os.close(fd)
    finally:
        for fd, _ in held[1:]:
            os.close(fd)
