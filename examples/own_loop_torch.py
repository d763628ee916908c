"""Your own PyTorch training loop on hvdtrain: a plain Horovod MNIST script ported to
:func:`hvdtrain.torch.prepare` (docs/guides/own-loop.md shows the port line by line).

    horovodrun -np 2 -H localhost:2 python examples/own_loop_torch.py --output runs/own-loop
    horovodrun -np 2 -H localhost:2 python examples/own_loop_torch.py --output runs/own-loop --resume
    python examples/own_loop_torch.py --output runs/own-loop --resume      # alone, one process
    hvdtrain report runs/own-loop                                          # the Trainer's report

Data: real MNIST digits embedded in hvdtrain (``hvdtrain.load_mnist``, no download). Any hvdtrain
key can follow as ``KEY=VALUE`` (the gradient exchange and its state, as on the command line):

    horovodrun -np 2 -H localhost:2 python examples/own_loop_torch.py comm.compression=powersgd
    horovodrun -np 2 -H localhost:2 python examples/own_loop_torch.py parallel.shard_optimizer=gradients

``--resume`` continues from the newest checkpoint in ``--output`` (exactly where it stopped, at any
number of workers); ``--stop-after N`` ends every worker abruptly after update N, as a killed job
would (what the resume is for).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvdtrain
from hvdtrain.torch import prepare


def mnist(split: str, limit: int) -> TensorDataset:
    """``limit`` MNIST images of ``split`` as float tensors (N, 1, 28, 28) in [0, 1], and labels."""
    images, labels = hvdtrain.load_mnist(split, limit=limit)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0)
    return TensorDataset(x, torch.from_numpy(labels))


def build_model() -> torch.nn.Module:
    """A small convolutional network for 28x28 digits, with dropout as pytorch/examples' MNIST has
    (a resume inside an epoch gives back the same dropout masks, bit for bit)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.25), torch.nn.Linear(16 * 7 * 7, 10))


@torch.no_grad()
def evaluate(run, model: torch.nn.Module, val: TensorDataset) -> dict[str, float]:
    """Validation loss and accuracy over all workers (each evaluates every size-th image)."""
    model.eval()
    x, y = val.tensors[0][run.rank::run.size], val.tensors[1][run.rank::run.size]
    out = model(x.to(run.device))
    sums = run.sum({"loss": F.cross_entropy(out, y.to(run.device), reduction="sum"),
                    "correct": (out.argmax(1).cpu() == y).sum(), "count": len(y)})
    model.train()
    return {"val_loss": sums["loss"] / sums["count"], "val_accuracy": sums["correct"] / sums["count"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/own-loop", help="where checkpoints and metrics go")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training images (a seeded subset)")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="updates between step checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output")
    parser.add_argument("--stop-after", type=int, default=None, help="exit abruptly after this update (a kill)")
    parser.add_argument("keys", nargs="*", metavar="KEY=VALUE", help="hvdtrain config keys")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.995)  # stepped once per update
    train = DataLoader(mnist("train", args.samples), batch_size=args.batch_size, shuffle=True)
    val = mnist("val", 512)
    # a refusal (a bad key, a checkpoint of another run) ends the job with one line on rank 0, no traceback
    run = prepare(model, optimizer, train, scheduler, overrides=args.keys)  # hvd.init, broadcast, exchange
    if args.resume and run.load(args.output):
        run.print(f"resumed at epoch {run.position.epoch + 1}, after {run.position.consumed} samples "
                  f"(update {run.updates})")
    model, optimizer = run.model, run.optimizer

    for epoch in run.epochs(args.epochs):
        total, batches = 0.0, 0
        for x, y in run.data:
            loss = F.cross_entropy(model(x.to(run.device)), y.to(run.device))
            loss.backward()
            optimizer.step()  # the planned gradient exchange, then your AdamW; leaves the gradients zeroed
            scheduler.step()
            total, batches = total + loss.item(), batches + 1
            if run.updates % args.checkpoint_every == 0:
                run.save(args.output)  # step-N: every rank calls it, rank 0 writes
            if run.updates == args.stop_after:
                os._exit(3)  # as if killed: nothing after the last checkpoint is kept
        metrics = {"loss": run.mean(total / max(1, batches)), **evaluate(run, model, val)}
        run.save(args.output, metrics)  # epoch-N, and a row of metrics.jsonl
        run.print(f"epoch {epoch + 1}: loss {metrics['loss']:.4f}, val_accuracy {metrics['val_accuracy']:.4f}")


if __name__ == "__main__":
    main()
