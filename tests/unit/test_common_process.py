"""A service slow to stop writes its threads' stacks to its log, once, so whoever kills it can see why."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, threading
    from trainforge_services.common.process import start_service

    stop = start_service(slow_stop_s={slow})
    print("ready", flush=True)
    stop.wait()

    def stuck_in_shutdown():
        threading.Event().wait({stuck})

    stuck_in_shutdown()
    print("stopped", flush=True)
""")


def _run(slow: float, stuck: float) -> tuple[str, str]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(slow=slow, stuck=stuck)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    return out, err


def test_a_service_stuck_after_sigterm_dumps_every_thread():
    out, err = _run(slow=0.2, stuck=1.5)
    assert "stopped" in out
    assert "stuck_in_shutdown" in err and "Thread 0x" in err


def test_a_service_that_stops_promptly_writes_nothing():
    out, err = _run(slow=5.0, stuck=0.0)
    assert "stopped" in out and "stuck_in_shutdown" not in err and "Thread 0x" not in err
