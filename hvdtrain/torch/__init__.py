"""PyTorch adapter: Horovod's DistributedOptimizer, broadcasts and rank-0 checkpoints for torch; and
:func:`prepare`, hvdtrain inside your own training loop."""

from hvdtrain.core import quick_exit

quick_exit.install()  # before the framework is imported: a shorter teardown at exit

from hvdtrain.torch import waiting  # noqa: E402

waiting.install()  # Horovod's torch collectives waited for with backoff, not a spin (HVDTRAIN_TORCH_WAIT=spin: Horovod's)

from hvdtrain.torch.adapter import TorchAdapter, build_optimizer, decay_groups  # noqa: E402
from hvdtrain.torch.prepare import DistributedStep, OwnLoop, prepare  # noqa: E402

__all__ = ["DistributedStep", "OwnLoop", "TorchAdapter", "build_optimizer", "decay_groups", "prepare"]
