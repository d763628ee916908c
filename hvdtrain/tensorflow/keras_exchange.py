"""The gradient exchange of :func:`hvdtrain.keras.DistributedOptimizer`: the Trainer's, chosen by the
same config keys.

:func:`check` loads the keys the optimizer was given (dotted names with ``__`` for dots, as
:func:`hvdtrain.torch.prepare` takes them: ``comm__compression="powersgd"``) with the config loader
and asks the rulebook (:mod:`hvdtrain.core.rules`), so a refused combination raises the command
line's one line naming both keys. Only the keys of the exchange are taken (:data:`KEYS`); the rest
configure the Trainer's loop and are refused by name, the ones that need the Trainer's adapter
(:data:`TRAINER_ONLY`: ZeRO's sharded optimizer state, bitwise mode, pipeline stages) saying so.
Horovod's arguments map onto the keys: ``compression=hvd.Compression.fp16`` is
``comm.compression="fp16"``, ``op=hvd.Adasum`` is ``comm.reduction="adasum"``; a key that says
otherwise is refused naming both.

:class:`Planned` plans the exchange (:func:`hvdtrain.core.exchange_plan.plan_exchange`) and builds it
for the variables the optimizer updates with the adapter's factory
(:func:`hvdtrain.tensorflow.exchanges.data_parallel`): Horovod's allreduce (average, fp16 on the wire,
Adasum), PowerSGD, top-k or local SGD (which averages the optimizer's trainable variables, and with
``comm.local_sgd_average_optimizer`` its state; the model's non-trainable variables, BatchNorm's
statistics, stay each worker's own, as under Horovod's allreduce). Its state variables are created
eagerly (``tf.init_scope``), outside the step ``model.fit`` traces, and are not the optimizer's own:
:class:`hvdtrain.keras.Checkpoints` keeps each worker's copy in ``comm_state.npz``, as the Trainer
does (:mod:`hvdtrain.core.compression_state`), through :class:`Holder`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.core import own_loop, rules
from hvdtrain.core.compression import comm_plan
from hvdtrain.core.config import ConfigError, RunConfig, load_config
from hvdtrain.core.exchange_plan import Workers, plan_exchange
from hvdtrain.tensorflow.adapter import tensorflow_collectives
from hvdtrain.tensorflow.exchanges import data_parallel

#: The config keys DistributedOptimizer takes: those that choose and tune the gradient exchange.
KEYS = ("comm.compression", "comm.reduction", "comm.powersgd_rank", "comm.powersgd_start_step",
        "comm.powersgd_min_size", "comm.topk_ratio", "comm.local_sgd_steps", "comm.local_sgd_average_optimizer",
        "train.fp16_allreduce")

#: Exchanges that need the Trainer's adapter: key -> why.
TRAINER_ONLY = {
    "parallel.shard_optimizer": "ZeRO's optimizer state in 1/N slices is updated by the Trainer's adapter",
    "train.reproducible": "bitwise mode's fixed micro-batches and summation tree run in the Trainer's step",
    "parallel.pipeline_stages": "the Trainer cuts the model into stages and runs each stage's passes",
}

#: Keys whose job a Keras optimizer does itself: key -> what to pass instead.
KERAS_OWN = {
    "train.grad_accumulation": "pass gradient_accumulation_steps to your Keras optimizer",
    "optim.grad_clip_norm": "pass clipnorm or global_clipnorm to your Keras optimizer",
    "comm.overlap": "pass groups=None (each gradient reduced as soon as it exists) or groups=1 (one fused allreduce)",
}

#: Horovod's arguments and the key each one is: (argument, key, ((value, its name, the key's value), ...)).
ARGUMENTS = (("compression", "comm.compression", ((hvd.Compression.none, "hvd.Compression.none", "none"),
                                                  (hvd.Compression.fp16, "hvd.Compression.fp16", "fp16"))),
             ("op", "comm.reduction", ((hvd.Average, "hvd.Average", "average"), (hvd.Adasum, "hvd.Adasum", "adasum"))))

ALIASES = {"comm.compression": "train.fp16_allreduce"}  # a key the loader turns into another


def _not_taken(key: str, value: Any) -> str | None:
    """Why DistributedOptimizer does not take ``key`` (one line), or None."""
    if key in KEYS:
        return None
    if key in TRAINER_ONLY:
        return (f"{key}={value!r} is Trainer-only ({TRAINER_ONLY[key]}); DistributedOptimizer runs inside Keras's "
                f"train step: leave {key} unset, or train through hvdtrain.Trainer / a recipe")
    hint = KERAS_OWN.get(key, "it configures the Trainer's loop (hvdtrain.Trainer / a recipe)")
    return f"{key}={value!r} is not a DistributedOptimizer setting ({hint}); it takes {', '.join(KEYS)}"


def _argument(argument: str, value: Any) -> tuple[str, str, str]:
    """(key, the value's name, the key's value) of Horovod's ``argument=value``; another value is refused."""
    for name, key, choices in ARGUMENTS:
        if name == argument:
            for choice, label, setting in choices:
                if value is choice or value == choice:
                    return key, label, setting
            allowed = " or ".join(label for _, label, _ in choices)
            raise ConfigError(f"DistributedOptimizer: {argument}={value!r} is not one of {allowed} "
                              f"(hvdtrain's other exchanges: {key.replace('.', '__')}=...)")
    raise AssertionError(argument)


def check(compression: Any, op: Any, keys: dict[str, Any], accumulation: int | None = None,
          loss_scaled: bool = False) -> RunConfig:
    """The config of ``keys`` with Horovod's ``compression`` and ``op`` (None: not given), loaded
    as :func:`hvdtrain.torch.prepare` loads its keys and allowed by the rulebook; ``accumulation``:
    the Keras optimizer's ``gradient_accumulation_steps``; ``loss_scaled``: it is a
    ``LossScaleOptimizer`` (the Trainer's ``train.mixed_precision=fp16``). Raises
    :class:`~hvdtrain.core.config.ConfigError` with one line naming what it refuses."""
    given = {key.replace("__", "."): value for key, value in keys.items() if value is not None}
    for key, value in given.items():
        problem = _not_taken(key, value)
        if problem:
            raise ConfigError(problem)
    mapped: dict[str, tuple[str, str]] = {}  # key -> (argument=name, the key's value)
    for argument, value in (("compression", compression), ("op", op)):
        if value is None:
            continue
        key, label, setting = _argument(argument, value)
        if key in given and given[key] != setting:
            raise ConfigError(f"{argument}={label} contradicts {key}={given[key]!r}; set one of them")
        mapped[key] = (f"{argument}={label}", setting)
    top = {**{k.replace(".", "__"): v for k, v in given.items()},
           **{k.replace(".", "__"): setting for k, (_, setting) in mapped.items()}}
    config = load_config(None, recipe=own_loop.RECIPE, framework="tensorflow", **top)
    for key, (label, setting) in mapped.items():
        section, name = key.split(".")
        if getattr(getattr(config, section), name) != setting:  # an alias given besides (train.fp16_allreduce)
            other = ALIASES.get(key, key)
            raise ConfigError(f"{label} contradicts {other}={given.get(other)!r}; set one of them")
    problem = rules.refusal(config)
    if problem:
        raise ConfigError(problem)
    scaled = SimpleNamespace(comm=config.comm, train=SimpleNamespace(mixed_precision="fp16"))
    problem = rules.error_feedback_with_loss_scaling(scaled) if loss_scaled else None
    if problem:
        raise ConfigError(f"LossScaleOptimizer (the Trainer's train.mixed_precision=fp16): {problem}")
    if accumulation and comm_plan(config) is not None:
        chosen = ", ".join(f"{k}={given[k]!r}" for k in ("comm.compression", "comm.local_sgd_steps") if k in given)
        raise ConfigError(f"gradient_accumulation_steps={accumulation} (the Keras optimizer's) cannot be combined "
                          f"with {chosen}: Keras would run hvdtrain's exchange on every micro-batch; leave one of "
                          f"them unset")
    return config


class Planned:
    """The exchange a distributed Keras optimizer runs: planned from ``config`` (what :func:`check`
    returned) once Horovod has started, and built for the variables the optimizer updates
    (``groups``: Horovod's allreduce fusion, 1 or None)."""

    def __init__(self, config: RunConfig, groups: int | None) -> None:
        self.config, self.groups = config, groups
        self.exchange: Any = None
        self.count = -1  # the number of variables it was built for

    def exchange_for(self, optimizer: Any, variables: list[Any]) -> Any:
        """The exchange of ``variables``' gradients (built on first use, eagerly even inside a traced
        step; again for another number of variables)."""
        if self.exchange is None or self.count != len(variables):
            with tf.init_scope():  # state variables created outside any traced step
                plan = plan_exchange(self.config, Workers(hvd.size(), hvd.local_size()))
                replica = SimpleNamespace(variables=list(variables))  # what local SGD averages: the trainable ones
                self.exchange = data_parallel(plan, list(variables), replica, optimizer, self.groups)
            self.count = len(variables)
        return self.exchange


class Holder:
    """What :mod:`hvdtrain.core.compression_state` reads of an adapter, for an optimizer's
    ``exchange`` in :class:`hvdtrain.keras.Checkpoints` (every rank builds one, in the same order)."""

    def __init__(self, exchange: Any, name: str) -> None:
        self.exchange, self._name, self._count = exchange, name, 0
        self.collectives = tensorflow_collectives(self._next)

    def _next(self, prefix: str) -> str:
        self._count += 1
        return f"hvdtrain.keras.{self._name}.{prefix}.{self._count}"

    def context(self) -> Any:
        """Where this process sits (``size``, ``is_main``)."""
        return SimpleNamespace(size=hvd.size(), rank=hvd.rank(), is_main=hvd.rank() == 0)

    def gather_object_to_root(self, obj: Any) -> Any:
        """Every rank's ``obj`` on rank 0 (a collective)."""
        return self.collectives.gather_object_to_root(obj)  # distributed

    def scatter_objects_from_root(self, items: Any) -> Any:
        """Rank 0's ``items[r]`` on rank ``r`` (a collective)."""
        return self.collectives.scatter_objects_from_root(items)  # distributed

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a collective)."""
        return self.collectives.broadcast_object(obj)  # distributed

    def model_buffers(self) -> None:
        """None: the Keras model's own variables are saved by the callback (rank 0's)."""
        return None


def exchange_of(optimizer: Any) -> Any:
    """The exchange ``optimizer`` (a :func:`~hvdtrain.keras.DistributedOptimizer`) runs (built now
    if the optimizer was built before it was made distributed), None for another optimizer or an
    unbuilt one."""
    planned = getattr(optimizer, "__dict__", {}).get("_hvdtrain_planned")
    if planned is None or not optimizer.built:
        return None
    return planned.exchange_for(optimizer, list(optimizer._trainable_variables))  # pylint: disable=protected-access
