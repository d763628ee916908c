"""Keras 3 ``model.fit`` through hvdtrain.keras, stepped one batch at a time: a side of
benchmarks/workers/overhead.py (``--keras-fit``), next to hvdtrain's own TensorFlow step.

The same model (the image recipe's), optimizer (SGD with momentum, the baseline's LR), loss, batch
and seed as the other sides; the gradients averaged by ``hvdtrain.keras.DistributedOptimizer``, the
variables broadcast by its callback, the batches from ``hvdtrain.keras.batches``. ``model.fit``
itself runs (its epoch iterator, its callbacks, its traced train step) in a thread that a callback
holds before each batch, so that the benchmark can interleave its steps with the others'.
"""

from __future__ import annotations

import threading
from typing import Iterator

import horovod.tensorflow as hvd
import keras
import numpy as np

import common
import hvdtrain.keras as hk
from hvdtrain_recipes.image_classification.keras_models import build_model


class _Lockstep(keras.callbacks.Callback):
    """Each batch starts when the benchmark says so and tells it when it has ended."""

    def __init__(self) -> None:
        super().__init__()
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)

    def on_train_batch_begin(self, batch, logs=None):
        self.go.acquire()

    def on_train_batch_end(self, batch, logs=None):
        self.done.release()


def train_steps(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> Iterator[None]:
    """Train on this rank's shard of ``x`` with ``model.fit``, yielding after every step."""
    hvd.init()  # distributed
    keras.utils.set_random_seed(seed)
    model = build_model(model_name, x.shape[1:], 10)
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=common.LR * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data, steps = hk.batches(*hk.shard((x, y)), batch_size=batch, seed=seed)  # distributed: agree on the steps
    lockstep = _Lockstep()
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            model.fit(data, steps_per_epoch=steps, epochs=1 << 20, shuffle=False, verbose=0,
                      callbacks=[hk.BroadcastGlobalVariablesCallback(0), lockstep])
        except BaseException as exc:  # noqa: BLE001  (reported by the generator)
            failure.append(exc)
            lockstep.done.release()

    threading.Thread(target=fit, name="keras-fit", daemon=True).start()
    while True:
        lockstep.go.release()
        lockstep.done.acquire()
        if failure:
            raise RuntimeError("model.fit failed") from failure[0]
        yield
