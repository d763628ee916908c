"""TensorFlow / Keras 3 adapter: DistributedGradientTape, variable broadcasts, rank-0 checkpoints."""

from hvdtrain.tensorflow.adapter import TensorFlowAdapter, build_optimizer, low_rank_variables

__all__ = ["TensorFlowAdapter", "build_optimizer", "low_rank_variables"]
