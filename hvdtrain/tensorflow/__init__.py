"""TensorFlow / Keras 3 adapter: DistributedGradientTape, variable broadcasts, rank-0 checkpoints."""

from hvdtrain.core import quick_exit

quick_exit.install()  # before the framework is imported: a shorter teardown at exit

from hvdtrain.tensorflow.adapter import TensorFlowAdapter  # noqa: E402
from hvdtrain.tensorflow.optimizers import build_optimizer, low_rank_variables  # noqa: E402

__all__ = ["TensorFlowAdapter", "build_optimizer", "low_rank_variables"]
