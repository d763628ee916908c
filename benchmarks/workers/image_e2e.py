"""Image pipeline end to end: share of step time spent waiting for data, and hvdtrain's TensorFlow
step against a hand-written Keras + Horovod loop, on the real-photo tree (benchmarks/photo_tree.py).

Per round, under horovodrun: (a) hvdtrain trains the image recipe (ResNet-18 at ``--size`` pixels,
``--steps`` steps of ``--batch`` per rank, the pipeline's decoding workers) and records when each
batch was ready and when each step started and ended; the data-wait share is the time steps waited
for a batch that was not ready yet, over the steady window; (b) with ``--framework tensorflow``,
the hand-written loop of benchmarks/horovod_tf_loop.py trains the same model on the same batches
(decoded once by the pipeline, held in memory), samples/s per rank side by side, and so does
hvdtrain's own step on those batches (``hvdtrain_memory_rate``: the step without the pipeline).

    PYTHONPATH=.:benchmarks horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/image_e2e.py \\
        /tmp/photos OUT.json --framework torch --size 112 --rounds 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import common  # noqa: F401  (puts the repository on sys.path)
from timing import TimedAdapter, TimedDataset
import hvdtrain
from hvdtrain.core.adapter import load_adapter
from hvdtrain.core.registry import get_builder

RECIPE = "image-classification"
TIMED = "bench-image-e2e"


def register(framework: str, datasets: list) -> None:
    spec = hvdtrain.get_recipe(RECIPE)
    build = get_builder(RECIPE, framework)
    hvdtrain.define_recipe(TIMED, defaults=spec.defaults, sections=spec.sections, moved_keys=spec.moved_keys,
                           replace=True)

    @hvdtrain.register_recipe(TIMED, framework=framework, replace=True)
    def timed(config, ctx):
        task = build(config, ctx)
        task.train_data = TimedDataset(task.train_data)
        datasets.append(task)
        return task


def hvdtrain_round(args, tmp: str, r: int, datasets: list) -> dict:
    samples = args.steps * args.batch * 2
    config = hvdtrain.load_config(hvdtrain.get_recipe(RECIPE).defaults, recipe=TIMED, framework=args.framework,
                                  overrides=[f"data.path={args.root}", f"output={tmp}/r{r}", "model.name=resnet18",
                                             f"image.size={args.size}", f"train.batch_size={args.batch}",
                                             f"data.max_train_samples={samples}", "data.max_val_samples=64",
                                             "train.epochs=1", "train.log_every=0", "train.threads=1",
                                             "train.tensorboard=false", "train.progress_bar=false",
                                             "checkpoint.enabled=false", "optim.warmup_epochs=0"])
    adapter = TimedAdapter(load_adapter(args.framework))
    trainer = hvdtrain.Trainer(config, adapter=adapter)
    trainer.fit()
    ready, starts, ends = datasets[-1].train_data.ready, adapter.starts, adapter.ends
    skip = common.SKIP_STEPS
    window = ends[-1] - ends[skip]
    waits = [max(0.0, ready[i] - ends[i - 1]) for i in range(skip + 1, len(ends))]
    gaps = [starts[i] - ends[i - 1] for i in range(skip + 1, len(ends))]
    return {"train_rate": common.steady_rate(ends, args.batch), "data_wait_share": sum(waits) / window,
            "between_steps_share": sum(gaps) / window, "steps": len(ends)}, adapter


def in_memory_rate(adapter, batches: list, steps: int, batch: int) -> float:
    """samples/s per rank of hvdtrain's own step (the trained adapter) on decoded uint8 batches held in
    memory: the step without the data pipeline beside it."""
    ends = []
    for x, y in itertools.islice(itertools.cycle(batches), steps):
        adapter.train_step(x, y, apply_update=True, weight=1.0)
        ends.append(time.perf_counter())
    return common.steady_rate(ends, batch)


def handwritten_tf_rate(args, batches: list) -> float:
    """samples/s per rank of benchmarks/horovod_tf_loop.py's step on pre-decoded float batches."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdtrain_recipes.image_classification.keras_models import build_model

    def _variables(variables):
        return [getattr(v, "value", v) for v in variables]

    keras.utils.set_random_seed(42)
    model = build_model("resnet18", batches[0][0].shape[1:], 8)
    optimizer = keras.optimizers.SGD(learning_rate=0.05 * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)  # distributed
        grads = tape.gradient(loss, _variables(model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    hvd.broadcast_variables(_variables(model.variables) + _variables(optimizer.variables), root_rank=0)  # distributed
    ends = []
    for x, y in itertools.islice(itertools.cycle(batches), args.steps):
        step(tf.constant(x), tf.constant(y))
        ends.append(time.perf_counter())
    return common.steady_rate(ends, args.batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--framework", default="torch")
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    datasets: list = []
    register(args.framework, datasets)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-e2e-") as tmp:
        for r in range(args.rounds):
            record, adapter = hvdtrain_round(args, tmp, r, datasets)
            if args.framework == "tensorflow":
                from hvdtrain.data.normalize import normalize_numpy

                data = datasets[-1].train_data.inner
                raw = [data.get_batch(np.arange(i * args.batch, (i + 1) * args.batch), 0) for i in range(4)]
                record["hvdtrain_memory_rate"] = in_memory_rate(adapter.inner, raw, args.steps, args.batch)
                batches = [(normalize_numpy(x), y) for x, y in raw]
                record["handwritten_rate"] = handwritten_tf_rate(args, batches)
            per_rank = adapter.allgather_object(record)  # distributed
            if adapter.context().rank == 0:
                rounds.append(per_rank)
                print(f"round {r + 1}: " + json.dumps(per_rank), flush=True)
    if rounds:
        Path(args.out).write_text(json.dumps({"framework": args.framework, "size": args.size, "batch": args.batch,
                                              "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
