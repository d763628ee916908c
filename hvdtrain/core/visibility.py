"""The callbacks every run gets unless its config turns them off: TensorBoard and the progress bar."""

from __future__ import annotations

from typing import Any

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.progress import ProgressBar
from hvdtrain.core.tensorboard_log import TensorBoardCallback


def default_callbacks(config: Any) -> list[Callback]:
    """``train.tensorboard`` -> :class:`TensorBoardCallback`; ``train.progress_bar`` -> :class:`ProgressBar`."""
    callbacks: list[Callback] = []
    if config.train.tensorboard:
        callbacks.append(TensorBoardCallback())
    if config.train.progress_bar:
        callbacks.append(ProgressBar())
    return callbacks
