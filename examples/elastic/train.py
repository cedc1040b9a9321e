"""A tiny elastic job: a linear model trained on a fixed synthetic set, checkpointed often.

Run by the platform as an elastic job (examples/elastic/manifest.yaml): each
learner is a torchrun node, and whenever a node joins or is lost torchrun
starts the workers again in a group of the new size; each resumes from the
newest checkpoint any rank holds (frameworks/torch/elastic.py). The group
size is printed at every (re)start, so the log shows the job shrink and grow.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from trainforge_frameworks.torch.elastic import load_shared_checkpoint
from trainforge_frameworks.torch.helper import (
    init_distributed,
    install_halt_handler,
    output_dir,
    rank,
    save_checkpoint,
    should_halt,
    world_size,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds each step takes at least")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    args = parser.parse_args()
    install_halt_handler()
    distributed = init_distributed("gloo")
    me, world = rank(), world_size()
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(8, dtype=torch.float32) + 1.0
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    found = load_shared_checkpoint()
    if found is not None:
        state, step = found
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    print(f"world {world}: rank {me} starts at step {step}", flush=True)
    while step < args.steps:
        started = time.monotonic()
        shard = slice(me, None, world)
        loss = torch.nn.functional.mse_loss(model(x[shard]).squeeze(1), y[shard])
        opt.zero_grad()
        loss.backward()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        step += 1
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict()}, step)
            print(f"world {world}: rank {me} saved step {step} loss {loss.item():.4f}", flush=True)
        if should_halt():
            save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict()}, step)
            return
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
    if me == 0:
        torch.save(model.state_dict(), output_dir("outputs") / "model.pt")
    print(f"world {world}: rank {me} done at step {step}", flush=True)


if __name__ == "__main__":
    main()
