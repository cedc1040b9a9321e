"""A small CNN trained with DDP on MNIST-like digits the script draws itself.

The example has to run anywhere the platform runs, without downloads, so
the data set is generated: ten 5x7 bitmap digits, scaled up, shifted and
dimmed at random and covered in noise, the same on every rank for a given
seed. Each learner trains on its DistributedSampler shard; gradients are
averaged over gloo, or NCCL when the learner was given a GPU (it then trains
on that GPU, with cuDNN's deterministic algorithms so a resumed run still
matches an uninterrupted one).

It uses the platform's learner helper for everything the platform
provides: the rendezvous (`init_distributed`), where results and
checkpoints go, periodic checkpoints (`checkpoint_due`, interval from the
manifest) and halting. A checkpoint is saved at the end of every epoch, when
one is due, and on a halt request (SIGTERM), always at a batch boundary that
every rank agrees on; its step counts the batches trained. A resumed run
skips the batches before that step (each epoch's order depends only on the
seed and the epoch), so with fixed seeds an interrupted and resumed run ends
with exactly the model of an uninterrupted one. Every rank checks that all
of them continue from the same step before training on. Run alone (`python train.py
--epochs 1`) it is a single process.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

# torch warns at import when numpy is absent; this example does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from trainforge_frameworks.torch.helper import (  # noqa: E402
    checkpoint_due,
    device,
    exit_learner,
    init_distributed,
    install_halt_handler,
    leave_distributed,
    load_checkpoint,
    output_dir,
    rank,
    save_checkpoint,
    should_halt,
    world_size,
)

OUTPUTS = "results"

GLYPHS = {
    0: ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    1: ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    2: ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    3: ["11111", "00010", "00100", "00010", "00001", "10001", "01110"],
    4: ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    5: ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    6: ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    7: ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    8: ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    9: ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
}
SIZE, SCALE = 28, 3
MAX_SHIFT = (3, 5)  # rows, columns: as far as a 21x15 glyph moves inside 28x28


def templates() -> torch.Tensor:
    """[10, 21, 15]: each bitmap digit blown up SCALE times."""
    bitmaps = torch.tensor([[[int(c) for c in row] for row in GLYPHS[d]] for d in range(10)], dtype=torch.float32)
    return bitmaps.repeat_interleave(SCALE, dim=1).repeat_interleave(SCALE, dim=2)


def make_digits(n: int, seed: int) -> TensorDataset:
    """n noisy, shifted digits with their labels; identical for identical (n, seed)."""
    g = torch.Generator().manual_seed(seed)
    glyphs = templates()
    h, w = glyphs.shape[1:]
    labels = torch.randint(0, 10, (n,), generator=g)
    shifts = torch.stack([torch.randint(-m, m + 1, (n,), generator=g) for m in MAX_SHIFT], dim=1)
    ink = 0.6 + 0.4 * torch.rand(n, generator=g)
    images = torch.zeros(n, 1, SIZE, SIZE)
    top0, left0 = (SIZE - h) // 2, (SIZE - w) // 2
    for i in range(n):
        top, left = top0 + int(shifts[i, 0]), left0 + int(shifts[i, 1])
        images[i, 0, top:top + h, left:left + w] = glyphs[labels[i]] * ink[i]
    images += 0.35 * torch.randn(images.shape, generator=g)
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 8x14x14
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 16x7x7
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# Where the collectives' tensors live: the training device (NCCL takes only CUDA tensors; gloo takes both).
DEVICE = torch.device("cpu")


def all_sum(values: list[float], distributed: bool) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=DEVICE)
    if distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def resume_point(state: dict, step: int, per_epoch: int) -> tuple[int, int]:
    """(epoch, batch within it) a checkpoint continues from; refuses one made with another epoch length."""
    epoch, batch = state["epoch"], state["batch"]
    if epoch * per_epoch + batch != step or not 0 <= batch < per_epoch:
        raise SystemExit(f"the checkpoint at step {step} (epoch {epoch + 1}, batch {batch}) does not fit "
                         f"{per_epoch} batches per epoch: resume with the same --batch-size, "
                         f"--train-samples and number of learners")
    return epoch, batch


def same_step_everywhere(step: int, distributed: bool) -> None:
    """Every rank must continue from the same step, or the ranks would wait in different all-reduces."""
    if not distributed:
        return
    t = torch.tensor([step, -step], device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    highest, lowest = int(t[0]), -int(t[1])
    if highest != lowest:
        raise SystemExit(f"the learners' checkpoints are at different steps ({lowest} to {highest}; -1: none); "
                         f"restore the same step for every learner")


def agree(distributed: bool) -> tuple[bool, bool]:
    """(halt, checkpoint now), the same on every rank: true as soon as any rank says so.

    Every rank must stop (or save) at the same batch, or one would wait in an
    all-reduce alone; one all-reduce per batch answers both questions.
    """
    flags = torch.tensor([int(should_halt()), int(checkpoint_due())], device=DEVICE)
    if distributed:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0]), bool(flags[1])


def evaluate(model: nn.Module, data: TensorDataset, me: int, world: int, distributed: bool) -> float:
    """Accuracy over the whole test set; each rank scores every world-th sample."""
    model.eval()
    images, labels = data.tensors
    with torch.no_grad():
        mine = slice(me, None, world)
        correct = (model(images[mine].to(DEVICE)).argmax(1) == labels[mine].to(DEVICE)).sum().item()
    correct, total = all_sum([correct, len(labels[mine])], distributed)
    return correct / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--train-samples", type=int, default=4000)
    parser.add_argument("--test-samples", type=int, default=1000)
    args = parser.parse_args(argv)

    global DEVICE
    started = time.monotonic()
    torch.set_num_threads(1)
    install_halt_handler()
    DEVICE = device()
    if DEVICE.type == "cuda":
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    distributed = init_distributed()
    me, world = rank(), world_size()
    print(f"rank {me}/{world} on {DEVICE}: generating {args.train_samples}+{args.test_samples} digits (seed {args.seed})",
          flush=True)
    train_set = make_digits(args.train_samples, args.seed)
    test_set = make_digits(args.test_samples, args.seed + 1)

    torch.manual_seed(args.seed)
    model = Net().to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # The order of every epoch depends only on (seed, epoch), also with one learner, so a run that
    # resumes at (epoch, batch) sees exactly the batches an uninterrupted run would have.
    sampler = DistributedSampler(train_set, num_replicas=world, rank=me, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    per_epoch = len(loader)
    metrics: dict = {"world_size": world, "epochs": []}
    first_epoch, first_batch, partial = 0, 0, [0.0, 0, 0]
    checkpoint = load_checkpoint()
    same_step_everywhere(-1 if checkpoint is None else checkpoint[1], distributed)
    if checkpoint is not None:
        state, step = checkpoint
        first_epoch, first_batch = resume_point(state, step, per_epoch)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        partial, metrics["epochs"] = state["partial"], state["epochs"]
        print(f"rank {me}: resuming from step {step} (epoch {first_epoch + 1}, batch {first_batch})", flush=True)
    ddp_model = model
    if distributed:
        ddp_model = DistributedDataParallel(model, device_ids=[0] if DEVICE.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss()

    def save(epoch: int, batch: int, sums: list) -> None:
        """Everything the rest of the run depends on, before batch `batch` of epoch `epoch` (both from 0).

        The step is the number of batches trained since the start, so it never goes back.
        """
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "batch": batch,
                 "partial": list(sums), "epochs": metrics["epochs"]}
        save_checkpoint(state, epoch * per_epoch + batch)

    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        skip = first_batch if epoch == first_epoch else 0
        loss_sum, correct, seen = partial if skip else (0.0, 0, 0)
        epoch_start = time.monotonic()
        for batch, (images, labels) in enumerate(loader):
            if batch < skip:
                continue  # trained before the checkpoint
            halt, due = agree(distributed)
            if halt or due:
                save(epoch, batch, [loss_sum, correct, seen])
            if halt:
                print(f"rank {me}: halt requested; checkpoint saved at step {epoch * per_epoch + batch}",
                      flush=True)
                leave_distributed()
                return 0
            images, labels = images.to(DEVICE), labels.to(DEVICE)
            optimizer.zero_grad()
            logits = ddp_model(images)
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(labels)
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
        loss_sum, correct, seen = all_sum([loss_sum, correct, seen], distributed)
        test_acc = evaluate(model, test_set, me, world, distributed)
        entry = {"epoch": epoch + 1, "loss": round(loss_sum / seen, 4), "train_accuracy": round(correct / seen, 4),
                 "test_accuracy": round(test_acc, 4), "seconds": round(time.monotonic() - epoch_start, 2)}
        metrics["epochs"].append(entry)
        print(f"epoch {entry['epoch']}/{args.epochs} loss {entry['loss']:.4f} "
              f"train_acc {entry['train_accuracy']:.3f} test_acc {entry['test_accuracy']:.3f} "
              f"({entry['seconds']:.1f}s)", flush=True)
        save(epoch + 1, 0, [0.0, 0, 0])

    test_acc = evaluate(model, test_set, me, world, distributed)
    print(f"final test accuracy: {test_acc:.4f}", flush=True)
    if me == 0:
        out = output_dir(OUTPUTS)
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out / "model.pt")  # loads anywhere
        metrics.update(test_accuracy=round(test_acc, 4), seconds=round(time.monotonic() - started, 2))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"saved {out / 'model.pt'} and {out / 'metrics.json'}", flush=True)
    leave_distributed()
    return 0


if __name__ == "__main__":
    exit_learner(main())
