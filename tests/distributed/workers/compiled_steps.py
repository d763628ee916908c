"""Worker for tests/distributed/test_compiled_steps.py: ``python compiled_steps.py FRAMEWORK REPORT DIR``
under ``horovodrun -np 2``.

A tiny model with BatchNorm (Dense/Linear 6 -> 16, BatchNorm, ReLU, in torch dropout, 16 -> 3) is trained through the
framework's adapter for three updates from the same weights (each rank its own slice of the
global batch, SGD with momentum and weight decay, global-norm clipping on), once eagerly
(``train.compile=none``) and once compiled (``train.compile=default``), for each gradient exchange:
Horovod's allreduce, float16 on the wire with two micro-batches per update, PowerSGD, local SGD
and (torch) the sharded optimizer. Then, with the allreduce: the BatchNorm statistics are averaged
(``sync_model_buffers``), each run's checkpoint (``save_state`` files, written by rank 0) is read
by the other kind of run, which takes one more update, and the saved keys are listed. In torch,
the number of Horovod allreduces the gradient hooks started during the compiled backward is
counted. Rank 0 writes everything to REPORT (JSON).
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvdtrain import ArrayDataset, TrainTask, load_config

FRAMEWORK, REPORT, DIRECTORY = sys.argv[1], sys.argv[2], Path(sys.argv[3])
FEATURES, HIDDEN, CLASSES, PER_RANK = 6, 16, 3, 8
DROPOUT = 0.25  # torch: on CPU the compiled step draws ATen's dropout masks (Inductor's fallback_random)
LRS = [0.1, 0.3, 0.05, 0.2]
COMMON = ["optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01", "optim.grad_clip_norm=2.0",
          "train.threads=1", "train.seed=0"]
EXCHANGES = {"allreduce": ["comm.overlap=always"],  # one allreduce per gradient, started by its hook
             "fp16_accumulation": ["comm.compression=fp16", "train.grad_accumulation=2"],
             "powersgd": ["comm.compression=powersgd", "comm.powersgd_min_size=16", "comm.powersgd_rank=2"],
             "local_sgd": ["comm.local_sgd_steps=2"]}
if FRAMEWORK == "torch":
    EXCHANGES["sharded"] = ["parallel.shard_optimizer=optimizer"]

rng = np.random.default_rng(5)
X = rng.standard_normal((256, FEATURES)).astype(np.float32)
Y = rng.integers(0, CLASSES, 256).astype(np.int64)


class Torch:
    """The torch side: model, task, weights, buffers, checkpoint keys."""

    def __init__(self):
        import torch

        from hvdtrain.torch import TorchAdapter
        self.torch = torch
        self.adapter = TorchAdapter()
        torch.manual_seed(3)
        self.start = self.new_model().state_dict()

    def new_model(self):
        nn = self.torch.nn
        return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Dropout(DROPOUT),
                             nn.Linear(HIDDEN, CLASSES))

    def seed(self, step, rank):
        """The same dropout masks for this update in every run (eager, compiled, resumed)."""
        self.torch.manual_seed(1000 * step + rank)

    def task(self, config):
        import torch.nn.functional as F

        from hvdtrain.torch import build_optimizer, decay_groups
        model = self.new_model()
        model.load_state_dict(self.start)
        dummy = ArrayDataset(X[:2], Y[:2])
        return TrainTask(model, build_optimizer(decay_groups(model, config.optim.weight_decay), config.optim),
                         F.cross_entropy, dummy, dummy, metric_sums=lambda out, y: {})

    def weights(self):
        return [p.detach().numpy().tolist() for p in self.adapter.model.parameters()]

    def buffers(self):
        return [b.detach().numpy().tolist() for b in self.adapter.model.buffers() if b.is_floating_point()]

    def saved_keys(self, directory):
        return sorted(self.torch.load(directory / "model.pt", weights_only=True))

    def started_allreduces(self):
        """Allreduces Horovod's gradient hooks have started and not yet been waited for."""
        handles = getattr(self.adapter.optimizer, "_handles", {})
        return sum(1 for handle, _ in handles.values() if handle is not None)


class TensorFlow:
    """The TensorFlow side."""

    def __init__(self):
        import keras

        from hvdtrain.tensorflow import TensorFlowAdapter
        self.keras = keras
        self.adapter = TensorFlowAdapter()
        self.start = None

    def new_model(self):
        layers = self.keras.layers
        return self.keras.Sequential([self.keras.Input((FEATURES,)), layers.Dense(HIDDEN), layers.BatchNormalization(),
                                      layers.ReLU(), layers.Dense(CLASSES)])

    def task(self, config):
        import tensorflow as tf

        from hvdtrain.tensorflow import build_optimizer
        model = self.new_model()
        if self.start is None:
            self.keras.utils.set_random_seed(3)
            self.start = [np.array(w) for w in self.new_model().get_weights()]
        model.set_weights(self.start)

        def loss(logits, labels):
            return tf.reduce_mean(self.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

        dummy = ArrayDataset(X[:2], Y[:2])
        return TrainTask(model, build_optimizer(config.optim), loss, dummy, dummy, metric_sums=lambda o, t: {})

    def weights(self):
        return [np.asarray(v.numpy()).tolist() for v in self.adapter.model.trainable_variables]

    def buffers(self):
        return [np.asarray(v.numpy()).tolist() for v in self.adapter.buffers]

    def saved_keys(self, directory):
        """The variable paths the checkpoint stores (Keras's per-process numbering made relative)."""
        from hvdtrain.tensorflow.checkpoint import canonical_paths
        with np.load(directory / "model_variables.npz") as saved:
            return canonical_paths([str(p) for p in saved["paths"]])

    def seed(self, step, rank):
        """No dropout in the TensorFlow model: nothing to seed."""

    def started_allreduces(self):
        return None  # the allreduce is a graph operation of the step, outside the XLA part


def main():
    side = Torch() if FRAMEWORK == "torch" else TensorFlow()
    adapter = side.adapter
    ctx = adapter.init(load_config(overrides=COMMON, framework=FRAMEWORK))

    def prepared(overrides, mode):
        config = load_config(overrides=[*COMMON, *overrides, f"train.compile={mode}"], framework=FRAMEWORK)
        adapter.prepare(side.task(config), config)
        adapter.broadcast_state()

    def update(step, probe=None):
        per_rank = PER_RANK * adapter.accumulation  # micro-batches of PER_RANK: one shape, one compiled graph
        idx = np.arange(step * per_rank * ctx.size, (step + 1) * per_rank * ctx.size).reshape(ctx.size, per_rank)
        adapter.set_learning_rate(LRS[step])
        side.seed(step, ctx.rank)
        micro = np.array_split(idx[ctx.rank], adapter.accumulation)
        for i, part in enumerate(micro):
            last = i == len(micro) - 1
            if probe is not None and last:  # the backward alone, then count the allreduces its hooks started
                adapter.train_step(X[part], Y[part], apply_update=False)
                probe.append(side.started_allreduces())
                adapter._apply_update()
            else:
                adapter.train_step(X[part], Y[part], apply_update=last)
        return side.weights()

    report = {"world_size": ctx.size, "runs": {}, "parameters": None}
    for name, overrides in EXCHANGES.items():
        runs = {}
        for mode in ("none", "default"):
            probe = [] if name == "allreduce" and FRAMEWORK == "torch" else None
            prepared(overrides, mode)
            history = [update(step, probe) for step in range(3)]
            runs[mode] = {"weights": history, "ranks": adapter.allgather_object(history[-1]),
                          "started_allreduces": probe}
            if name == "allreduce":
                runs[mode]["buffers_local"] = adapter.allgather_object(side.buffers())
                adapter.sync_model_buffers()
                runs[mode]["buffers"] = adapter.allgather_object(side.buffers())
                folder = DIRECTORY / mode
                if ctx.is_main:
                    folder.mkdir(parents=True, exist_ok=True)
                    adapter.save_state(folder)
                    runs[mode]["saved_keys"] = side.saved_keys(folder)
                adapter.barrier()  # rank 0 wrote the checkpoint
                runs[mode]["continued"] = update(3)
        if name == "allreduce":  # each run's checkpoint read by the other kind of run: one more update
            for mode, other in (("none", "default"), ("default", "none")):
                prepared(overrides, other)
                adapter.load_state(DIRECTORY / mode)
                adapter.broadcast_state()
                runs[mode]["resumed_by_other"] = update(3)
        report["runs"][name] = runs
        report["parameters"] = report["parameters"] or len(runs["none"]["weights"][0])
    if ctx.is_main:
        with open(REPORT, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
