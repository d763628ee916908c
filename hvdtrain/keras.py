"""Keras 3 ``model.fit`` on Horovod: what ``horovod.tensorflow.keras`` gave Keras 2 users, for Keras 3
with the TensorFlow backend (guide: docs/guides/keras-fit.md; example: examples/keras_fit.py)::

    import horovod.tensorflow as hvd
    import hvdtrain.keras as hk

    hk.init()                                   # hvd.init() under any launcher, or alone
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.AdamW(schedule)), loss=...)
    checkpoints = hk.Checkpoints("checkpoints")
    start = checkpoints.restore(model, resume=resume)
    data, steps = hk.batches(*hk.shard((x, y)), batch_size=64, seed=0, initial_epoch=start)
    model.fit(data, steps_per_epoch=steps, epochs=5, initial_epoch=start,
              callbacks=[hk.BroadcastGlobalVariablesCallback(0), hk.MetricAverageCallback(), checkpoints],
              verbose=1 if hvd.rank() == 0 else 0)

``DistributedOptimizer`` runs the Trainer's gradient exchange, Horovod's allreduce by default and the
others by the Trainer's config keys (``hk.DistributedOptimizer(opt, comm__compression="powersgd")``;
PowerSGD, top-k, local SGD), checked by the same rulebook.

Importing it imports TensorFlow, Keras and ``horovod.tensorflow`` (``import hvdtrain`` does not).
"""

from hvdtrain.tensorflow.keras_callbacks import (BroadcastGlobalVariablesCallback, Checkpoints,  # noqa: F401
                                                 MetricAverageCallback, broadcast_variables)
from hvdtrain.tensorflow.keras_data import batches, shard  # noqa: F401
from hvdtrain.tensorflow.keras_optimizer import DistributedOptimizer, WarmUp  # noqa: F401
from hvdtrain.tensorflow.keras_start import init  # noqa: F401

__all__ = ["BroadcastGlobalVariablesCallback", "Checkpoints", "DistributedOptimizer", "MetricAverageCallback",
           "WarmUp", "batches", "broadcast_variables", "init", "shard"]
