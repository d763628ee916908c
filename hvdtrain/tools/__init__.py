"""Tooling around a training job, apart from the training kernel in :mod:`hvdtrain.core`: the
throughput benchmark (``hvdtrain bench``), the environment report (``hvdtrain env``) and reading
Horovod's timeline. Nothing here imports torch or TensorFlow."""
