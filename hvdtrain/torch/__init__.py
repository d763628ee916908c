"""PyTorch adapter: Horovod's DistributedOptimizer, broadcasts and rank-0 checkpoints for torch."""

from hvdtrain.core import quick_exit

quick_exit.install()  # before the framework is imported: a shorter teardown at exit

from hvdtrain.torch.adapter import TorchAdapter, build_optimizer, decay_groups  # noqa: E402

__all__ = ["TorchAdapter", "build_optimizer", "decay_groups"]
