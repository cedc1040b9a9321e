"""The e2e tier: every test module gets its own embedded stack (`stack`), as `make demo` starts it."""

import json
import os

import pytest

from tests.e2e.test_embedded_stack import run_cli


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(env for the CLI, state dir, stack id) of a stack started with `trainforge up`, stopped after the module."""
    state = tmp_path_factory.mktemp("tf-state")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    env["PYTHONUNBUFFERED"] = "1"
    run_cli(env, "up", timeout=180)
    stack_id = json.loads((state / "stack.json").read_text())["stack_id"]
    yield env, state, stack_id
    run_cli(env, "down", timeout=120, check=False)
