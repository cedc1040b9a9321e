"""The sandbox entry's command line: `enter.py [--lifeline FD] [--hold FD] <config.json> <program> [args...]`."""

from __future__ import annotations

import pytest

from trainforge_services.controller.sandbox.enter import _arguments


def test_the_lifeline_is_optional_and_comes_first():
    assert _arguments(["enter.py", "--lifeline", "7", "c.json", "/bin/sh", "-c", "x"]) == (
        7, None, "c.json", ["/bin/sh", "-c", "x"])
    assert _arguments(["enter.py", "c.json", "/bin/sh", "-c", "x"]) == (None, None, "c.json", ["/bin/sh", "-c", "x"])


def test_a_held_learner_names_its_hold_pipe_after_the_lifeline():
    assert _arguments(["enter.py", "--lifeline", "7", "--hold", "9", "c.json", "/bin/sh", "-c", "x"]) == (
        7, 9, "c.json", ["/bin/sh", "-c", "x"])


@pytest.mark.parametrize(("argv", "says"), [
    (["enter.py", "--lifeline", "seven", "c.json", "/bin/sh"], "--lifeline needs a file descriptor number, not 'seven'"),
    (["enter.py", "--lifeline", "7", "c.json"], "usage: enter.py [--lifeline FD] [--hold FD] <config.json>"),
    (["enter.py", "--lifeline", "7", "--hold", "x", "c.json", "/bin/sh"], "--hold needs a file descriptor number"),
    (["enter.py"], "usage: enter.py"),
])
def test_a_bad_command_line_is_refused_with_what_is_wrong(argv, says):
    with pytest.raises(ValueError, match=None) as e:
        _arguments(argv)
    assert str(e.value).startswith(says)
