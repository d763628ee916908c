"""PyTorch adapter: Horovod's DistributedOptimizer, broadcasts and rank-0 checkpoints for torch."""

from hvdtrain.torch.adapter import TorchAdapter, build_optimizer, decay_groups

__all__ = ["TorchAdapter", "build_optimizer", "decay_groups"]
