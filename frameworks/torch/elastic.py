"""The script side of an elastic job: every rank resumes from the newest checkpoint any rank holds.

In an elastic job (manifest `learners: {min, max}`) each learner is a
torchrun agent node; when a node joins or is lost, torchrun stops the
workers on every node and starts them again in a group of the new size.
A restarted worker resumes from a checkpoint, but the nodes' checkpoint
directories need not agree: a node that just joined has none (or an old
one). `load_shared_checkpoint` picks the newest step any rank holds and
sends that state to every rank, so the whole group continues from the
same step. Like helper.py it imports nothing from `services/`.
"""

from __future__ import annotations

import io
from typing import Any

from trainforge_frameworks.torch.helper import load_checkpoint, world_size


def newest_holder(steps: list[int]) -> int | None:
    """The lowest rank holding the newest step in `steps` (-1: none), or None when no rank holds one."""
    best = max(steps, default=-1)
    return None if best < 0 else steps.index(best)


def load_shared_checkpoint() -> tuple[dict[str, Any], int] | None:
    """(state, step) of the newest checkpoint any rank holds, the same on every rank; None when none has one.

    Call after `init_distributed()` on every rank (a collective). Without a
    process group it is `load_checkpoint()`. Only tensor collectives are used
    (the object collectives need numpy); the state travels as `torch.save` bytes.
    """
    local = load_checkpoint()
    if world_size() <= 1:
        return local
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return local
    me, world = dist.get_rank(), dist.get_world_size()
    steps = torch.zeros(world, dtype=torch.int64)
    steps[me] = -1 if local is None else local[1]
    dist.all_reduce(steps)  # each rank filled only its own slot
    source = newest_holder([int(s) for s in steps.tolist()])
    if source is None:
        return None
    raw = b""
    if me == source:
        buffer = io.BytesIO()
        torch.save(local, buffer)
        raw = buffer.getvalue()
    size = torch.tensor([len(raw)], dtype=torch.int64)
    dist.broadcast(size, src=source)
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if me == source \
        else torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src=source)
    state, step = torch.load(io.BytesIO(bytes(data.untyped_storage())), map_location="cpu", weights_only=True)
    return state, int(step)
