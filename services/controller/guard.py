"""The learner's process-group leader: the learner's whole group dies with the controller.

Run by the controller (services/controller/learner.py) as
`python -I -S guard.py <fd> /bin/sh -c <command>`, in a new session, so the
guard leads the learner's process group. It starts the command in that
group, waits for it and exits the same way (the same code, or killed by the
same signal), so to the controller it looks exactly like the command.

Its one job of its own: `<fd>` is the read end of a pipe whose only write
end the controller holds. When the controller dies, even by SIGKILL, the
kernel closes that end, the read returns end-of-file and the guard
SIGKILLs its whole process group: the shell, the user's program and
whatever that started (torchrun workers, data loaders). A parent-death
signal (PR_SET_PDEATHSIG) would not do this: it reaches only the one process
it is set on (the shell, which forks the command rather than exec'ing it),
it is cleared by fork, and it fires when the *thread* that started the child
exits. The pipe has none of these limits, and a controller that died before
the guard even started is seen at once (the read returns end-of-file).

Held (a prestarted trial's learner, docs/EXPERIMENTS.md "Prestarted trials"):
`guard.py <fd> --hold <hold fd> <program> ...` starts, watches its lifeline
and then blocks reading `<hold fd>`, the read end of a second pipe whose
only write end the controller holds, before it starts the command. A byte
on it (the job's gate opened) starts the command at once; end-of-file (the
controller gave up the hold: a cancel, a halt, or it died) exits with
EXIT_NOT_STARTED without ever starting it. So everything of the learner's
start but the command itself is paid while the trial waits for its slot.
With `--pass-hold <hold fd>` instead, the command is a Python interpreter
that holds itself (services/controller/pyhold.py): the guard starts it at
once with the hold pipe open and named in its environment (TF_LEARNER_HOLD_FD),
and the learners' start-up hook blocks on it before the user's program runs.

Signals the controller sends to the group (SIGTERM on a halt) are meant for
the learner: the guard catches them and goes on waiting, so its exit still
tells how the command ended. One that comes before the command exists (a
stop while the guard's interpreter starts, or while it is held) reaches only
the guard; were it caught and forgotten, the command would start anyway,
never see it and be SIGKILLed once the grace period ran out. So the guard
blocks them until the command is spawned: one that came before is then
pending, the command is never started and the guard dies of that signal, as
the shell would have; one that came during the spawn (perhaps before the
fork) is passed on to the command. Only the standard library is used, and the
interpreter runs isolated (-I -S), so nothing of the user's environment is
imported here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

# The controller's signals for the learner; caught (not ignored, which the command would inherit).
_FORWARDED = (signal.SIGTERM, signal.SIGINT)
# the exit code of a held guard whose hold was given up: the command never started
EXIT_NOT_STARTED = 125
# names the hold pipe for a command that holds itself (pyhold.HOLD_FD_ENV; this file imports nothing of ours)
HOLD_FD_ENV = "TF_LEARNER_HOLD_FD"
# Python ignores these at start-up; the command gets them back as the kernel's default.
_RESET = (signal.SIGPIPE, signal.SIGXFSZ, *_FORWARDED)


def _kill_group_when_closed(fd: int) -> None:
    while os.read(fd, 4096):
        pass  # the controller never writes; end-of-file means it is gone
    os.killpg(0, signal.SIGKILL)


def released(hold: int) -> bool:
    """Block on the hold pipe: True once the controller wrote to it, False at end-of-file (given up)."""
    try:
        return bool(os.read(hold, 1))
    finally:
        os.close(hold)  # the learner never sees it


def pass_hold(hold: int) -> None:
    """Leave the hold pipe open for the command, which holds itself (the module's docstring)."""
    os.set_inheritable(hold, True)
    os.environ[HOLD_FD_ENV] = str(hold)


def _pending() -> list[int]:
    """The forwarded signals that came while blocked and wait to be delivered."""
    pending = signal.sigpending()
    return [sig for sig in _FORWARDED if sig in pending]


def _die_of(sig: int) -> int:
    """Exit killed by `sig` (pending, blocked), as the command would have been."""
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (sig,))  # delivered now
    os.kill(os.getpid(), sig)
    return 128 + sig


def main(argv: list[str]) -> int:
    hold, passed = None, False
    if len(argv) > 3 and argv[2] in ("--hold", "--pass-hold") and argv[3].isdigit():
        hold, passed, argv = int(argv[3]), argv[2] == "--pass-hold", argv[:2] + argv[4:]
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: guard.py <lifeline fd> [--hold <fd> | --pass-hold <fd>] <program> [args...]", file=sys.stderr)
        return 127
    fd, command = int(argv[1]), argv[2:]
    # Blocked until the command exists, in the lifeline thread too (it inherits the mask and never unblocks):
    # a stop that comes before then stays pending, for the look below.
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    os.set_inheritable(fd, False)  # the lifeline is the guard's, not the learner's
    # not a Loop: blocks reading the lifeline until the controller's end closes it
    threading.Thread(target=_kill_group_when_closed, args=(fd,), daemon=True).start()
    if passed:
        pass_hold(hold)
    elif hold is not None and not released(hold):
        return EXIT_NOT_STARTED
    if early := _pending():
        return _die_of(early[0])  # stopped before the command started: it never starts
    try:
        pid = os.posix_spawn(command[0], command, os.environ, setsigdef=_RESET, setsigmask=())
    except OSError as e:
        print(f"cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    if passed:
        os.close(hold)  # the command's to read; here it would only keep the pipe open after the command gave up
    for sig in _pending():
        os.kill(pid, sig)  # came during the spawn, maybe before the fork: the command's
    for sig in _FORWARDED:
        signal.signal(sig, lambda *_: None)  # caught and dropped (the command gets its own)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the same signal, so the controller sees what the command saw
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    os._exit(main(sys.argv))
