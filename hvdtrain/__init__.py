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

from hvdtrain._version import __version__  # noqa: E402,F401  (hvdtrain.__version__)

from hvdtrain import _lazy  # noqa: E402

# the public names and the modules that define them, imported on first use (PEP 562): a process
# that needs only part of the package (a data decoding worker imports hvdtrain.data) does not pay
# for the trainer, the launcher and YAML at start-up
_EXPORTS = {
    "hvdtrain.core.callbacks": ["Callback"],
    "hvdtrain.core.adapter": ["DistContext", "FrameworkAdapter", "FrameworkMissingError", "load_adapter"],
    "hvdtrain.core.checkpoint": ["CheckpointError", "CheckpointManager"],
    "hvdtrain.core.config": ["CheckpointConfig", "ConfigError", "DataConfig", "ModelConfig", "OptimConfig", "RunConfig",
                             "TrainConfig", "option"],
    "hvdtrain.core.resolve": ["load_config"],
    "hvdtrain.core.loop": ["RunResult", "TrainingError"],
    "hvdtrain.trainer": ["Trainer", "train"],
    "hvdtrain.core.registry": ["RecipeError", "define_recipe", "get_recipe", "list_recipes", "register_recipe",
                               "unregister_recipe"],
    "hvdtrain.core.task": ["ArrayDataset", "TrainTask", "accuracy_from_sums"],
    "hvdtrain.core.sources": ["SourceError", "as_source"],
    "hvdtrain.data.mnist": ["load_mnist"],
    "hvdtrain.data.images": ["ImageData", "open_images"],
    "hvdtrain.data.options": ["ImageOptions"],
    "hvdtrain.api": ["WorkerError", "run"],
}
__getattr__, __dir__, __all__ = _lazy.exports(__name__, _EXPORTS)
