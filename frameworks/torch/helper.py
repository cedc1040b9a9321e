"""The small side of the platform that runs inside a training script.

The controller tells a learner everything through its environment (see
docs/CONTRACTS.md, "Learner environment"); this module reads it so training
scripts do not hard-code paths or rendezvous details, and still run unchanged
on a laptop where none of it is set. It deliberately imports nothing from
`services/` (it runs in the user's process), and imports torch only where a
function needs it.

Halting is cooperative: the controller sends SIGTERM, `install_halt_handler`
turns it into a flag, and the training loop asks `should_halt()` at a step
boundary, saves a checkpoint and exits 0. Checkpoints are written to a
temporary file and renamed, and `checkpoint.json` (naming the step) is
written after the checkpoint file, so the files the controller uploads (and
a resumed learner loads) always form one complete checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

CHECKPOINT_FILE = "checkpoint.pt"
# Written after CHECKPOINT_FILE, so its presence marks a complete checkpoint: {"step": n, "saved_at": unix}.
CHECKPOINT_META = "checkpoint.json"

_halt_requested = threading.Event()
# Whether this process joined a process group (init_distributed), for exit_learner().
_joined_group = False
# When the last checkpoint was saved (or this module loaded), for checkpoint_due().
_last_save = time.monotonic()


def _dir_from_env(var: str, fallback: str) -> Path:
    path = Path(os.environ.get(var) or fallback)
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_dir(default: str = "checkpoints") -> Path:
    """Where checkpoints go (TF_CHECKPOINT_DIR, else `default` under the cwd); created if missing."""
    return _dir_from_env("TF_CHECKPOINT_DIR", default)


def output_dir(default: str = "outputs") -> Path:
    """Where results go (TF_OUTPUT_DIR, else `default` under the cwd); created if missing.

    Pass the manifest's `outputs` folder as `default` so a script writes to
    the same place on a laptop as on the platform.
    """
    return _dir_from_env("TF_OUTPUT_DIR", default)


def _int_env(var: str, default: int) -> int:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None


def rank() -> int:
    """This learner's global rank (RANK; 0 when not distributed)."""
    return _int_env("RANK", 0)


def world_size() -> int:
    """Number of learners in the job (WORLD_SIZE; 1 when not distributed)."""
    return _int_env("WORLD_SIZE", 1)


def device() -> Any:
    """The torch device this learner trains on: `cuda:0` when the platform gave it a GPU, else the CPU.

    The controller sets CUDA_VISIBLE_DEVICES to the learner's own GPUs (empty when it has none), so a
    learner's first GPU is always index 0, whatever its rank.
    """
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def distributed_backend() -> str:
    """"nccl" when this learner trains on a GPU and torch was built with NCCL, else "gloo".

    Collectives on "nccl" take CUDA tensors: put the tensors you all-reduce on `device()`.
    """
    import torch
    import torch.distributed as dist

    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_distributed(backend: str | None = None) -> bool:
    """Join the job's process group when there is more than one learner.

    Returns True when a process group is (now) initialised. The rendezvous
    comes from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (env://). `backend`
    defaults to `distributed_backend()`.
    """
    if world_size() <= 1:
        return False
    import torch.distributed as dist

    global _joined_group
    backend = backend or distributed_backend()
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank(), world_size=world_size())
    _joined_group = True
    return True


def leave_distributed() -> None:
    """Leave the process group together with the other learners (a no-op when none was joined).

    A barrier first: a learner that tears its connections down while a peer
    is still busy (rank 0 writing the results, say) can make gloo abort that
    peer.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_learner(code: int = 0) -> NoReturn:
    """End this learner with exit status `code`, after flushing stdout and stderr.

    For `if __name__ == "__main__": exit_learner(main())`. In a process that
    joined a process group it ends with `os._exit`, skipping the interpreter's
    teardown. After DistributedDataParallel, torch keeps the gloo group and
    its threads alive past `destroy_process_group` (something in C++ still
    holds the group), so they are torn down by the interpreter's exit while
    the peers close their connections; a learner of the example that had
    printed its final line was seen to abort there ("terminate called
    without an active exception", status 134, once on a loaded 2-core
    machine), failing a finished job. Call it only once the group was left and
    everything the learner writes is written and closed (checkpoints from
    `save_checkpoint` are already fsynced): atexit handlers do not run. A
    process that never joined a group exits normally (`sys.exit`).
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can reach it
    if _joined_group:
        os._exit(code)
    sys.exit(code)


def _fsync_dir(directory: Path) -> None:
    """Make renames in directory durable (a crash right after a save must not undo it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temp(directory: Path, name: str, write: Any) -> Path:
    """write(file) into a fsynced temporary file next to `name` (a dot name: the platform skips those)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _atomic_write(directory: Path, name: str, write: Any) -> Path:
    """write(file) into a temporary file, fsync, then rename over `name`: readers see old or new, never half."""
    final = directory / name
    tmp = _write_temp(directory, name, write)
    try:
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return final


def step_in(directory: Path) -> int | None:
    """The step `checkpoint.json` in directory names, or None when it holds no complete checkpoint.

    The platform reads a checkpoint directory with this too (it uploads
    copies of it, see the module docstring), so both sides agree on what
    counts as complete.
    """
    try:
        return int(json.loads((directory / CHECKPOINT_META).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def last_step() -> int | None:
    """The step of the latest complete checkpoint in the checkpoint directory, or None."""
    return step_in(checkpoint_dir())


def save_checkpoint(state: dict[str, Any], step: int) -> Path:
    """Atomically replace the checkpoint with `state` at `step`; returns its path.

    The step counter never goes back: a step smaller than the last saved
    one is refused (ValueError). The order of the writes is the contract
    with whoever copies the directory meanwhile (the platform uploads it
    while training goes on, docs/CONTRACTS.md): the state is serialised to a
    temporary file first, then `checkpoint.json` is removed, the new file
    renamed into place, and `checkpoint.json` written last naming the new
    step. A complete checkpoint is therefore exactly one whose
    `checkpoint.json` exists, and a copier that finds the same
    `checkpoint.json` file before and after copying knows no file was
    replaced in between. A failure while serialising leaves the previous
    checkpoint untouched.
    """
    import torch

    global _last_save
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    previous = last_step()
    if previous is not None and step < previous:
        raise ValueError(f"step {step} is before the last checkpoint's step {previous}; steps never go back")
    directory = checkpoint_dir()
    final, meta_path = directory / CHECKPOINT_FILE, directory / CHECKPOINT_META
    tmp = _write_temp(directory, CHECKPOINT_FILE, lambda f: torch.save({"step": step, "state": state}, f))
    try:
        meta_path.unlink(missing_ok=True)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    meta = json.dumps({"step": step, "saved_at": time.time()}).encode()
    _atomic_write(directory, CHECKPOINT_META, lambda f: f.write(meta))  # fsyncs the directory: both renames
    _last_save = time.monotonic()
    return final


def checkpoint_interval() -> float:
    """Seconds between periodic checkpoints (TF_CHECKPOINT_INTERVAL, from the manifest); 0: none."""
    raw = os.environ.get("TF_CHECKPOINT_INTERVAL", "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable TF_CHECKPOINT_INTERVAL={raw!r} is not a number") from None
    return max(0.0, value)


def checkpoint_due() -> bool:
    """True when the checkpoint interval has passed since the last save (or since start); never blocks.

    With several learners, agree on it (e.g. an all-reduce of the flag) so
    every rank saves at the same step.
    """
    interval = checkpoint_interval()
    return interval > 0 and time.monotonic() - _last_save >= interval


def load_checkpoint(weights_only: bool = True) -> tuple[dict[str, Any], int] | None:
    """(state, step) of the latest checkpoint, or None when there is none.

    Tensors are loaded onto the CPU; move them where they belong. With
    `weights_only` (the default) only tensors and plain containers are
    unpickled, since a checkpoint may come from the object store.
    """
    import torch

    path = checkpoint_dir() / CHECKPOINT_FILE
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=weights_only)
    return payload["state"], int(payload["step"])


def install_halt_handler(signum: int = signal.SIGTERM) -> None:
    """Turn `signum` into a halt request that `should_halt()` reports.

    Call once from the main thread, before training starts.
    """
    signal.signal(signum, lambda _sig, _frame: _halt_requested.set())


def should_halt() -> bool:
    """True once the halt signal arrived; never blocks."""
    return _halt_requested.is_set()


# -- training metrics ----------------------------------------------------------------------
#
# A learner reports metrics by appending JSON lines to a file in its working
# directory; its controller tails the file and ships the records beside the
# log (docs/CONTRACTS.md, "Training metrics"). Writing a local file never waits
# on the network. Plain scripts in any language can follow the same
# convention: append `{"step": 12, "loss": 0.41, ...}` lines to
# $TF_METRICS_FILE (default `.tf-metrics.jsonl` in $TF_WORKDIR or the cwd).
# Reserved names describe progress: `epoch`, `total_steps`, `total_epochs`.

METRICS_FILE = ".tf-metrics.jsonl"
_metrics_lock = threading.Lock()


def metrics_file() -> Path:
    """Where `report_metrics` appends ($TF_METRICS_FILE, else METRICS_FILE in $TF_WORKDIR or the cwd)."""
    explicit = os.environ.get("TF_METRICS_FILE", "").strip()
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("TF_WORKDIR") or ".") / METRICS_FILE


def report_metrics(step: int, **values: float) -> None:
    """Record metric values at a training step, e.g. report_metrics(100, loss=0.41, accuracy=0.87).

    Non-blocking: one line appended to a local file (no network). Values must
    be numbers; `epoch`, `total_steps` and `total_epochs` feed the job's
    progress and ETA in `trainforge status`.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    clean: dict[str, float] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # a 0-d tensor or numpy scalar
            except (TypeError, ValueError):
                raise ValueError(f"metric {name!r} must be a number, got {value!r}") from None
        clean[name] = value
    record = json.dumps({"step": step, "ts": round(time.time(), 3), **clean}, allow_nan=True)
    path = metrics_file()
    with _metrics_lock, open(path, "a", encoding="utf-8") as f:
        f.write(record + "\n")
