"""Pipeline parallelism for PyTorch (``parallel.pipeline_stages > 1``): :class:`TorchPipelineAdapter`.

The schedule is :mod:`hvdtrain.core.gpipe`'s; the torch primitives are :mod:`hvdtrain.torch.stage`.
"""

from __future__ import annotations

import horovod.torch as hvd

from hvdtrain.core.gpipe import StagedAdapter
from hvdtrain.torch.adapter import TorchAdapter
from hvdtrain.torch.stage import TorchStage


class TorchPipelineAdapter(StagedAdapter, TorchAdapter):
    """The model cut into stages across the ranks of each replica, replicas data-parallel."""

    stage_class = TorchStage
    horovod = hvd
