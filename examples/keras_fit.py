"""Keras 3 ``model.fit`` on Horovod through hvdtrain.keras: MNIST (embedded, no download), AdamW with a
warmed-up cosine schedule, the ranks' gradients averaged, rank-0 checkpoints and an exact resume.

    horovodrun -np 2 -H localhost:2 python examples/keras_fit.py
    horovodrun -np 2 -H localhost:2 python examples/keras_fit.py --resume     # after a stop: goes on
    horovodrun -np 1 -H localhost:1 python examples/keras_fit.py --resume     # or that, on 1 worker

A run stopped at any point and resumed on as many workers ends with the weights the uninterrupted
run ends with, bit for bit (the last epoch checkpoint's model and optimizer variables and epoch
count are restored, and each epoch's batches depend on the seed and the epoch only). Each update
takes a global batch of --global-batch-size images (128 by default) at any number of workers, so a
run may also resume on another one (any that divides the global batch; the same weights up to
float rounding). With --batch-size instead, each worker takes batches of its own share and the
global batch grows with the workers. A run that hvdtrain refuses (a checkpoint folder in use
without --resume, a global batch the workers cannot share) stops with one line, ``hvdtrain: error:
...``, printed by rank 0 (``hk.init()`` sees to that). The guide: docs/guides/keras-fit.md.
"""

from __future__ import annotations

import argparse

import horovod.tensorflow as hvd
import keras
import numpy as np

import hvdtrain
import hvdtrain.keras as hk


def positive(text: str) -> int:
    """A batch size: a whole number of 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--global-batch-size", type=positive, default=None,
                       help="images per update, all workers together (default 128 when --batch-size is not given)")
    batch.add_argument("--batch-size", type=positive, default=None,
                       help="images per worker per update instead (the global batch: this x the workers)")
    parser.add_argument("--lr", type=float, default=2e-3, help="the peak learning rate (all workers together)")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--limit", type=int, default=12000, help="training images used (of 60,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoints", default="runs/keras_fit/checkpoints")
    parser.add_argument("--resume", action="store_true", help="go on from the newest checkpoint")
    return parser.parse_args(argv)


def build_model(seed: int) -> keras.Model:
    """A small MLP, initialised from ``seed`` (rank 0's initial weights are broadcast anyway)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])


def main(argv: list[str] | None = None, callbacks: tuple = ()) -> keras.callbacks.History:
    """Train; returns ``fit``'s History (``callbacks``: more of them, after hvdtrain's)."""
    args = parse(argv)
    hk.init()  # hvd.init(), also alone and under srun
    x, y = hvdtrain.load_mnist("train", limit=args.limit, seed=args.seed)
    x_val, y_val = hvdtrain.load_mnist("val", limit=2000, seed=args.seed)
    x, x_val = (x / 255.0).astype(np.float32), (x_val / 255.0).astype(np.float32)

    model = build_model(args.seed)
    if args.batch_size is None:  # the same global batches at any world size: each worker takes its part of each
        sizes = {"global_batch_size": 128 if args.global_batch_size is None else args.global_batch_size}
        steps = len(x) // sizes["global_batch_size"]
    else:
        sizes = {"batch_size": args.batch_size}
        steps = (len(x) // hvd.size()) // args.batch_size
    schedule = hk.WarmUp(keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=args.epochs * steps),
                         warmup_steps=args.warmup_steps)
    optimizer = hk.DistributedOptimizer(keras.optimizers.AdamW(learning_rate=schedule, weight_decay=1e-4))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    checkpoints = hk.Checkpoints(args.checkpoints)
    initial_epoch = checkpoints.restore(model, resume=args.resume)  # 0, or the epochs the checkpoint had done
    train = (x, y) if args.batch_size is None else hk.shard((x, y))  # all rows, or this worker's share
    data, steps = hk.batches(*train, **sizes, seed=args.seed, initial_epoch=initial_epoch)
    history = model.fit(
        data, steps_per_epoch=steps, epochs=args.epochs, initial_epoch=initial_epoch, shuffle=False,
        validation_data=hk.shard((x_val, y_val)),
        callbacks=[hk.BroadcastGlobalVariablesCallback(0), hk.MetricAverageCallback(), checkpoints, *callbacks],
        verbose=2 if hvd.rank() == 0 else 0)
    if hvd.rank() == 0 and history.history:
        print(f"epoch {args.epochs}: val_accuracy {history.history['val_accuracy'][-1]:.4f}, "
              f"checkpoints in {checkpoints.directory}", flush=True)
    return history


if __name__ == "__main__":
    main()  # a refusal (a used checkpoint folder, a batch the workers cannot share): hk.init()'s one line
