"""The platform's start-up hook for Python learners: one write(2) per printed line.

The controller runs learners with PYTHONUNBUFFERED=1 so their logs follow live,
and puts this folder first on their PYTHONPATH (services/controller/linebuf.py).
Under PYTHONUNBUFFERED a text stream is write-through: `print(line)` makes two
write(2) calls, the text and then "\\n". Here stdout and stderr, where they are
pipes, become line-buffered instead: every write that holds "\\n" or "\\r" (or
an explicit flush) hands the text to the kernel in one call, so `print(line)`
is one write(2), and every complete line is in the pipe as soon as it is
printed (a SIGKILL loses none of them). Text without "\\n" or "\\r" waits for
the next of those, an explicit flush, a fork from the main thread, or the
interpreter's exit: as on a terminal.

Nothing is done when PYTHONUNBUFFERED is unset or empty (the learner chose
buffered output), when `-u` was given on the command line (asked for
explicitly; Python 3.10+, which records it in sys.orig_argv), or for a
stream that is not a write-through text stream on a pipe. Then this folder leaves
sys.path and the next `sitecustomize` on the path (a user's or the
distribution's) runs as if this one were not there; PYTHONPATH itself keeps
the folder, so the learner's own Python subprocesses get the hook too.

It also holds a prestarted trial (services/controller/pyhold.py): when
TF_LEARNER_HOLD_FD names the hold pipe, the hook first takes the variable
out of the environment and blocks reading that pipe, before anything of the
user's runs (its own sitecustomize, its program). A byte starts the program;
end-of-file (the hold was given up) exits with 125 (guard.EXIT_NOT_STARTED)
without running any of it, and so does any failure to hold: a learner that
cannot be held is never run early.

Written for any CPython 3.7+ (a job's own environment may be older than the
platform's) and importing only what site already loaded. The file keeps to
syntax that even older interpreters parse (no f-strings): one that failed to
parse it would run a held learner's program unheld.
"""

import os
import stat
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_HOLD_FD_ENV = "TF_LEARNER_HOLD_FD"  # pyhold.HOLD_FD_ENV
_NOT_STARTED = 125  # guard.EXIT_NOT_STARTED


def _hold():
    """Block on the hold pipe, if this interpreter was started held; exit without going on if it is given up."""
    fd = os.environ.pop(_HOLD_FD_ENV, None)  # pop also unsets it for the program's own subprocesses
    if fd is None:
        return
    try:
        fd = int(fd)
        go = os.read(fd, 1)
        os.close(fd)
    except BaseException as e:  # noqa: BLE001 - any failure: never run the program unheld
        try:
            why = "%s: %s" % (type(e).__name__, e)  # noqa: UP031 - no f-string: the file must parse anywhere
            os.write(2, ("trainforge: the learner could not be held (" + why + "); not starting it\n").encode())
        finally:
            os._exit(_NOT_STARTED)
    if not go:
        os._exit(_NOT_STARTED)  # the hold was given up: nothing of the program ran


def _dash_u(argv):
    """Whether the interpreter's own options (before -c, -m or the script) include -u."""
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)
            continue
        if arg.startswith("--"):
            continue
        if not arg.startswith("-") or arg == "-":
            return False
        for i, flag in enumerate(arg[1:], start=2):
            if flag == "u":
                return True
            if flag in "cm":  # the rest is the command or the module: the interpreter's options ended
                return False
            if flag in "XW":  # the rest of this argument, or else the next one, is the option's value
                if i == len(arg):
                    next(args, None)
                break
    return False


def _line_buffer(stream):
    """Make stream line-buffered if it is an unbuffered text stream on a pipe; whether it was changed."""
    try:
        if stream is None or not stream.write_through or not stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
            return False
        stream.reconfigure(line_buffering=True, write_through=False)
        return True
    except (AttributeError, OSError, ValueError):
        return False


def _install():
    # write-through streams come from PYTHONUNBUFFERED or -u; only the platform's variable is taken back
    if not os.environ.get("PYTHONUNBUFFERED") or _dash_u(getattr(sys, "orig_argv", [])):
        return
    changed = [s for s in (sys.stdout, sys.stderr) if _line_buffer(s)]
    if not changed or not hasattr(os, "register_at_fork"):
        return
    import _thread

    main = _thread.get_ident()

    def flush_before_fork():
        # A forked child would otherwise inherit a pending partial line and print it again at its exit.
        # Only from the main thread: from another one, the flush could race the main thread's own write.
        if _thread.get_ident() != main:
            return
        for stream in changed:
            try:
                stream.flush()
            except Exception:  # a closed or replaced stream: nothing of ours to flush
                pass

    os.register_at_fork(before=flush_before_fork)


def _chain():
    """Leave sys.path and run the next sitecustomize on it, which then stands as `sitecustomize`."""
    sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == _HERE)]
    sys.path_importer_cache.pop(_HERE, None)
    # The import system's own modules, loaded already (importing importlib.util would cost each start ~2 ms).
    external, bootstrap = sys.modules.get("_frozen_importlib_external"), sys.modules.get("_frozen_importlib")
    if external is None or bootstrap is None:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec
    else:
        PathFinder, module_from_spec = external.PathFinder, bootstrap.module_from_spec

    spec = PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    # The import system takes sys.modules["sitecustomize"] as the module once this file has run.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_hold()
try:
    _install()
except Exception:  # never in the learner's way: its streams stay as the interpreter made them
    pass
_chain()
