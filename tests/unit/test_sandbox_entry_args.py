"""The sandbox entry's command line:
`enter.py [--lifeline FD] [--hold FD | --pass-hold FD] <config.json> <program> [args...]`."""

from __future__ import annotations

import pytest

from trainforge_services.controller.sandbox.enter import _arguments


def test_the_lifeline_is_optional_and_comes_first():
    assert _arguments(["enter.py", "--lifeline", "7", "c.json", "/bin/sh", "-c", "x"]) == (
        7, None, False, "c.json", ["/bin/sh", "-c", "x"])
    assert _arguments(["enter.py", "c.json", "/bin/sh", "-c", "x"]) == (
        None, None, False, "c.json", ["/bin/sh", "-c", "x"])


def test_a_held_learner_names_its_hold_pipe_after_the_lifeline():
    assert _arguments(["enter.py", "--lifeline", "7", "--hold", "9", "c.json", "/bin/sh", "-c", "x"]) == (
        7, 9, False, "c.json", ["/bin/sh", "-c", "x"])


def test_a_hold_passed_on_to_the_command_is_told_apart():
    assert _arguments(["enter.py", "--lifeline", "7", "--pass-hold", "9", "c.json", "/bin/sh", "-c", "x"]) == (
        7, 9, True, "c.json", ["/bin/sh", "-c", "x"])


@pytest.mark.parametrize(("argv", "says"), [
    (["enter.py", "--lifeline", "seven", "c.json", "/bin/sh"], "--lifeline needs a file descriptor number, not 'seven'"),
    (["enter.py", "--lifeline", "7", "c.json"], "usage: enter.py [--lifeline FD] [--hold FD | --pass-hold FD]"),
    (["enter.py", "--lifeline", "7", "--hold", "x", "c.json", "/bin/sh"], "--hold needs a file descriptor number"),
    (["enter.py", "--pass-hold", "x", "c.json", "/bin/sh"], "--pass-hold needs a file descriptor number"),
    (["enter.py", "--hold", "8", "--pass-hold", "9", "c.json", "/bin/sh"], "--hold and --pass-hold: one hold"),
    (["enter.py", "--pass-hold", "9", "--hold", "8", "c.json", "/bin/sh"], "usage: enter.py"),
    (["enter.py"], "usage: enter.py"),
])
def test_a_bad_command_line_is_refused_with_what_is_wrong(argv, says):
    with pytest.raises(ValueError, match=None) as e:
        _arguments(argv)
    assert str(e.value).startswith(says)
