"""hvdtrain: one Horovod core, PyTorch and TensorFlow/Keras 3 adapters, recipes on top.

The public API (importing it loads neither torch nor TensorFlow)::

    import hvdtrain
    config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults,
                                  overrides=["train.epochs=1"], framework="torch")
    result = hvdtrain.train(config)          # in every worker (under horovodrun) or alone

Recipes are registered with :func:`define_recipe` and :func:`register_recipe`. From a notebook,
:func:`run` starts N workers and returns rank 0's result::

    result = hvdtrain.run("image-classification", framework="torch", np=2, train__epochs=1)
"""

from hvdtrain.tools import tf_logging

tf_logging.install()  # before anything can import TensorFlow: quiet start-up, the user's TF_CPP_MIN_LOG_LEVEL wins

from hvdtrain._version import __version__  # noqa: E402

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.adapter import DistContext, FrameworkAdapter, FrameworkMissingError, load_adapter
from hvdtrain.core.checkpoint import CheckpointError, CheckpointManager
from hvdtrain.core.config import (CheckpointConfig, ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig,
                                  TrainConfig, option)
from hvdtrain.core.resolve import load_config
from hvdtrain.core.loop import RunResult, Trainer, TrainingError, train
from hvdtrain.core.registry import (RecipeError, define_recipe, get_recipe, list_recipes, register_recipe,
                                    unregister_recipe)
from hvdtrain.core.task import ArrayDataset, TrainTask, accuracy_from_sums
from hvdtrain.api import WorkerError, run  # noqa: E402  (after the core it builds on)

__all__ = [
    "ArrayDataset", "Callback", "CheckpointConfig", "CheckpointError", "CheckpointManager", "ConfigError", "DataConfig",
    "DistContext", "FrameworkAdapter", "FrameworkMissingError", "ModelConfig", "OptimConfig", "RecipeError",
    "RunConfig", "RunResult", "WorkerError", "TrainConfig", "TrainTask", "Trainer", "TrainingError", "accuracy_from_sums",
    "define_recipe", "get_recipe", "list_recipes", "load_adapter", "load_config", "option", "register_recipe", "run", "train",
    "unregister_recipe",
]
