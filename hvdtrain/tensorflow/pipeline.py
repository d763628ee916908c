"""Pipeline parallelism for TensorFlow / Keras 3 (``parallel.pipeline_stages > 1``):
:class:`TensorFlowPipelineAdapter`.

The schedule is :mod:`hvdtrain.core.gpipe`'s; the TensorFlow primitives and
:func:`functional_blocks` (a Keras model cut into blocks) are :mod:`hvdtrain.tensorflow.stage`.
"""

from __future__ import annotations

import horovod.tensorflow as hvd

from hvdtrain.core.gpipe import StagedAdapter
from hvdtrain.tensorflow.adapter import TensorFlowAdapter
from hvdtrain.tensorflow.stage import TensorFlowStage, functional_blocks

__all__ = ["TensorFlowPipelineAdapter", "functional_blocks"]


class TensorFlowPipelineAdapter(StagedAdapter, TensorFlowAdapter):
    """The model cut into stages across the ranks of each replica, replicas data-parallel."""

    stage_class = TensorFlowStage
    horovod = hvd
