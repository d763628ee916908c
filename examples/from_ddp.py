"""The PyTorch DDP tutorial's torchrun script (``multigpu_torchrun.py``: ``init_process_group``,
``DistributedSampler``, the ``DDP`` wrapper, a snapshot to resume from) ported to
:func:`hvdtrain.torch.prepare` (docs/guides/from-ddp.md shows the port line by line).

    torchrun --standalone --nproc_per_node=2 examples/from_ddp.py 4 1 --output runs/from-ddp
    torchrun --standalone --nproc_per_node=2 examples/from_ddp.py 6 1 --output runs/from-ddp  # resumes at epoch 4
    horovodrun -np 2 -H localhost:2 python examples/from_ddp.py 4 1 --output runs/from-ddp   # the same job
    hvdtrain report runs/from-ddp

Arguments as in the tutorial: ``total_epochs``, ``save_every`` (epochs between snapshots), and
``--batch-size`` per worker. Data: real MNIST digits embedded in hvdtrain (no download).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

import hvdtrain
from hvdtrain.torch import prepare


class Trainer:
    """The tutorial's Trainer: one ``prepare`` call where it set up DDP and loaded its snapshot."""

    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_path: str) -> None:
        self.batch_size = train_data.batch_size
        self.run = prepare(model, optimizer, train_data)  # Horovod (torchrun's job), broadcasts, exchange, sampler
        self.model, self.optimizer, self.train_data = self.run.model, self.run.optimizer, self.run.data
        self.save_every, self.snapshot_path = save_every, snapshot_path
        if self.run.load(snapshot_path):  # the newest snapshot, if there is one
            self.run.print(f"Resuming training from snapshot at Epoch {self.run.epoch}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        output = self.model(source.to(self.run.device))
        loss = F.cross_entropy(output, targets.to(self.run.device))
        loss.backward()
        self.optimizer.step()  # the gradient exchange, then SGD; the gradients are left zeroed
        return loss.item()

    def _run_epoch(self, epoch: int) -> float:
        b_sz = self.batch_size
        print(f"[rank {self.run.rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}",
              flush=True)
        losses = [self._run_batch(source, targets) for source, targets in self.train_data]
        return self.run.mean(sum(losses) / max(1, len(losses)))  # over all workers

    def train(self, max_epochs: int) -> None:
        for epoch in self.run.epochs(max_epochs):  # from the snapshot's epoch on
            loss = self._run_epoch(epoch)
            if (epoch + 1) % self.save_every == 0 or epoch + 1 == max_epochs:
                self.run.save(self.snapshot_path, {"loss": loss})  # every rank calls it; rank 0 writes
                self.run.print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")


def load_train_objs(samples: int) -> tuple[Dataset, torch.nn.Module, torch.optim.Optimizer]:
    """The dataset, model and optimizer (the tutorial's are a random dataset and one linear layer)."""
    images, labels = hvdtrain.load_mnist("train", limit=samples)
    train_set = TensorDataset(torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0),
                              torch.from_numpy(labels))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int) -> DataLoader:
    """No DistributedSampler: prepare() deals each worker its share, and knows where it stopped."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=True)


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str, samples: int) -> None:
    dataset, model, optimizer = load_train_objs(samples)
    train_data = prepare_dataloader(dataset, batch_size)
    try:
        trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    except (hvdtrain.ConfigError, hvdtrain.TrainingError, hvdtrain.CheckpointError) as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr)  # e.g. a torchrun variable missing, named
        sys.exit(2)
    trainer.train(total_epochs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch-size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--output", default="runs/from-ddp", help="where snapshots and metrics go")
    parser.add_argument("--samples", default=2048, type=int, help="training images (a seeded subset)")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.output, args.samples)
