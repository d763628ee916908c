"""Starting Horovod for a Keras script (public as ``hvdtrain.keras.init``): the same start the
TensorFlowAdapter makes, without a config."""

from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.core import script_errors
from hvdtrain.launch import slurm
from hvdtrain.launch.start import prepare_horovod_environment


def init() -> None:
    """``hvd.init()`` where hvdtrain's launchers and a lone process work: under ``horovodrun``,
    ``mpirun``, in a Slurm step (``srun``; the step becomes a Gloo job) or alone (one Gloo rank: a
    plain ``hvd.init()`` in a lone process tries an MPI singleton start, which PyPI's relocated
    Open MPI cannot do). Then each worker sees one GPU, ``hvd.local_rank()``'s, with memory growth
    on (where there are GPUs). Call it instead of ``hvd.init()``, before building the model.

    From then on hvdtrain's refusals that the script does not catch (a ``ConfigError``, a
    ``CheckpointError``: every rank raises them alike) end the job as ``hvdtrain``'s commands do: one
    line ``hvdtrain: error: ...`` printed by rank 0, no traceback, exit status 2 (a bad value) or 1
    (:func:`hvdtrain.core.script_errors.install`)."""
    script_errors.install(hvd.rank)  # before Horovod starts, every process speaks as rank 0
    prepare_horovod_environment(None)
    hvd.init()
    slurm.check_world_size(hvd.size())
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
