"""A framework adapter in pure NumPy, and a tiny recipe for it: the Trainer in-process, in milliseconds.

:class:`NumpyAdapter` implements :class:`hvdtrain.core.adapter.FrameworkAdapter` for one process
(world size 1: ``allreduce_sums`` returns its input, the broadcasts and gathers are trivial,
``barrier`` does nothing). Its model is a linear softmax classifier trained with SGD and momentum
(the torch update rule: ``v = momentum * v + g``, ``w -= lr * v``) on in-memory arrays. Every step
draws an input-dropout mask from a ``np.random.Generator`` whose state is :meth:`rng_state`, so an
exact resume has to carry the adapter's random state as well as the weights. State is saved as
``model.npz`` and ``optimizer.npz``.

:func:`register_toy_recipe` registers recipe ``toy`` (framework ``torch``: the adapter is injected
with ``Trainer(config, adapter=NumpyAdapter())``, so no torch is imported) over a fixed synthetic
data set. Its options make the data or the metrics do what a test needs: a NaN sample, a scripted
validation score.

Keep this file small and plain: the adapter interface is expected to shrink.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from hvdtrain.core.adapter import DistContext, FrameworkAdapter, NonFiniteGradientError, NonFiniteStateError
from hvdtrain.core.registry import define_recipe, register_recipe, unregister_recipe
from hvdtrain.core.task import ArrayDataset, TrainTask

RECIPE = "toy"
N_TRAIN, N_VAL, N_FEATURES, N_CLASSES = 96, 32, 6, 3
DROPOUT = 0.1
MODEL_FILE, OPTIMIZER_FILE = "model.npz", "optimizer.npz"
# 96 samples in batches of 8: 12 optimizer steps per epoch
DEFAULTS = {"train": {"epochs": 2, "batch_size": 8, "log_every": 0, "tensorboard": False, "progress_bar": False},
            "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}


class LinearSoftmax:
    """``logits = x @ weight + bias``; parameters by name, float64."""

    def __init__(self, params: dict[str, np.ndarray]):
        self.params = params

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x @ self.params["weight"] + self.params["bias"]

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray, weight: float) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy on the batch and its gradient, scaled by ``weight``."""
        logits = self.forward(x)
        logits = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
        dlogits = probs
        dlogits[np.arange(len(y)), y] -= 1.0
        dlogits *= weight / len(y)
        return loss, {"weight": x.T @ dlogits, "bias": dlogits.sum(axis=0)}


def cross_entropy_sum(logits: np.ndarray, y: np.ndarray) -> float:
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].sum())


class NumpyAdapter(FrameworkAdapter):
    """One process, NumPy only. ``applied_lrs``: the LR of every update this instance applied, in order."""

    name = "numpy"

    def __init__(self) -> None:
        self.skipped_updates = 0
        self.rng = np.random.default_rng(0)
        self.applied_lrs: list[float] = []

    # -- set-up -------------------------------------------------------------------------------
    def init(self, config: Any) -> DistContext:
        self.config = config
        self.rng = np.random.default_rng(config.train.seed)
        return DistContext()

    def prepare(self, task: TrainTask, config: Any) -> None:
        self.task, self.model = task, task.model
        self.momentum = config.optim.momentum
        self.weight_decay = config.optim.weight_decay
        self.nonfinite = config.train.nonfinite
        self.accumulation = config.train.grad_accumulation
        self.velocity = {k: np.zeros_like(v) for k, v in self.model.params.items()}
        self.pending: dict[str, np.ndarray] | None = None
        self.lr = config.optim.lr

    def broadcast_state(self, root_rank: int = 0) -> None:
        pass

    # -- training ------------------------------------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        self.lr = lr

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> Any:
        weight = 1.0 / self.accumulation if weight is None else weight
        x = np.asarray(inputs, dtype=np.float64)
        x = x * (self.rng.random(x.shape) >= DROPOUT) / (1.0 - DROPOUT)  # input dropout: uses the RNG state
        loss, grads = self.model.loss_and_grads(x, np.asarray(targets), weight)
        if self.pending is None:
            self.pending = grads
        else:
            self.pending = {k: self.pending[k] + grads[k] for k in grads}
        if apply_update:
            grads, self.pending = self.pending, None
            if not all(np.isfinite(g).all() for g in grads.values()):
                if self.nonfinite == "error":
                    raise NonFiniteGradientError("the gradient is not finite")
                self.skipped_updates += 1
            else:
                for k, p in self.model.params.items():
                    g = grads[k] + self.weight_decay * p
                    self.velocity[k] = self.momentum * self.velocity[k] + g
                    p -= self.lr * self.velocity[k]
                self.applied_lrs.append(self.lr)
        return np.float64(loss)

    def sync_model_buffers(self) -> None:
        pass

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def eval_step(self, inputs: Any, targets: Any) -> dict[str, Any]:
        logits = self.model.forward(np.asarray(inputs, dtype=np.float64))
        return {"loss_sum": cross_entropy_sum(logits, targets), "count": float(len(targets)),
                **self.task.metric_sums(logits, targets)}

    # -- collectives: one process ----------------------------------------------------------------
    def allreduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def context(self) -> DistContext:
        return DistContext()

    # -- state ----------------------------------------------------------------------------------
    def rng_state(self) -> dict[str, Any]:
        return {"generator": self.rng.bit_generator.state}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["generator"]

    def snapshot(self) -> Any:
        return copy.deepcopy((self.model.params, self.velocity, self.rng.bit_generator.state))

    def restore_snapshot(self, snapshot: Any) -> None:
        params, velocity, rng = copy.deepcopy(snapshot)
        for k, v in params.items():
            self.model.params[k][...] = v
        self.velocity = velocity
        self.rng.bit_generator.state = rng

    def elastic_reset(self) -> None:
        pass

    def save_state(self, directory: Path) -> None:
        if not all(np.isfinite(p).all() for p in self.model.params.values()):
            raise NonFiniteStateError("model parameters are not finite")
        with open(Path(directory) / MODEL_FILE, "wb") as f:
            np.savez(f, **self.model.params)
        with open(Path(directory) / OPTIMIZER_FILE, "wb") as f:
            np.savez(f, **{f"velocity/{k}": v for k, v in self.velocity.items()})

    def load_state(self, directory: Path) -> None:
        with np.load(Path(directory) / MODEL_FILE) as saved:
            for k in self.model.params:
                self.model.params[k][...] = saved[k]
        with np.load(Path(directory) / OPTIMIZER_FILE) as saved:
            self.velocity = {k: saved[f"velocity/{k}"].copy() for k in self.model.params}


def load_weights(checkpoint: Path) -> dict[str, np.ndarray]:
    """A checkpoint folder's model arrays by name."""
    with np.load(Path(checkpoint) / MODEL_FILE) as saved:
        return {k: saved[k] for k in saved.files}


# ------------------------------------------------------------------------------------------ recipe
def toy_data() -> tuple[ArrayDataset, np.ndarray, np.ndarray, np.ndarray]:
    """A fixed, learnable data set (the same in every run): train inputs, train labels, val inputs, val labels."""
    rng = np.random.default_rng(1234)
    centres = rng.normal(0.0, 2.0, (N_CLASSES, N_FEATURES))
    y = rng.integers(0, N_CLASSES, N_TRAIN + N_VAL)
    x = centres[y] + rng.normal(0.0, 1.0, (len(y), N_FEATURES))
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def register_toy_recipe(nan_samples: Iterable[int] = (), nan_epoch: int = 0,
                        scores: Sequence[float] | None = None) -> str:
    """(Re)register recipe ``toy`` and return its name.

    ``nan_samples``: training samples whose inputs are NaN in (0-based) epoch ``nan_epoch``, so the
    step that reads one gets a NaN gradient. ``scores``: the evaluations report ``val_score`` as
    these values in turn (a metric whose best epoch a test chooses).
    """
    x_train, y_train, x_val, y_val = toy_data()
    poisoned = np.asarray(sorted(nan_samples), dtype=np.int64)
    evaluations = iter(list(scores or ()))

    def poison(x: np.ndarray, y: np.ndarray, indices: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if epoch == nan_epoch and len(poisoned):
            x = x.copy()
            x[np.isin(indices, poisoned)] = np.nan
        return x, y

    def metric_sums(logits: np.ndarray, y: np.ndarray) -> dict[str, float]:
        return {"correct": float((logits.argmax(axis=1) == y).sum())}

    def finalize(sums: dict[str, float]) -> dict[str, float]:
        metrics = {"accuracy": sums["correct"] / max(1.0, sums["count"])}
        if scores is not None:
            metrics["score"] = next(evaluations)
        return metrics

    define_recipe(RECIPE, description="in-process test recipe (NumPy linear softmax)", defaults=DEFAULTS,
                  replace=True)

    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config: Any, ctx: DistContext) -> TrainTask:
        rng = np.random.default_rng(config.train.seed)
        model = LinearSoftmax({"weight": rng.normal(0.0, 0.1, (N_FEATURES, N_CLASSES)),
                               "bias": np.zeros(N_CLASSES)})
        return TrainTask(model=model, optimizer=None, loss_fn=cross_entropy_sum,
                         train_data=ArrayDataset(x_train, y_train, transform=poison),
                         val_data=ArrayDataset(x_val, y_val), metric_sums=metric_sums,
                         finalize_metrics=finalize)

    return RECIPE


def unregister_toy_recipe() -> None:
    unregister_recipe(RECIPE)
