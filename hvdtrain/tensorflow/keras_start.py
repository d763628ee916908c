"""Starting Horovod for a Keras script (public as ``hvdtrain.keras.init``): the same start the
TensorFlowAdapter makes, without a config."""

from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.launch import slurm
from hvdtrain.launch.start import prepare_horovod_environment


def init() -> None:
    """``hvd.init()`` where hvdtrain's launchers and a lone process work: under ``horovodrun``,
    ``mpirun``, in a Slurm step (``srun``; the step becomes a Gloo job) or alone (one Gloo rank: a
    plain ``hvd.init()`` in a lone process tries an MPI singleton start, which PyPI's relocated
    Open MPI cannot do). Then each worker sees one GPU, ``hvd.local_rank()``'s, with memory growth
    on (where there are GPUs). Call it instead of ``hvd.init()``, before building the model."""
    prepare_horovod_environment(None)
    hvd.init()
    slurm.check_world_size(hvd.size())
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
