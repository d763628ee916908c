"""Worker for tests/distributed/test_optimizer_semantics.py: run under horovodrun -np 2.

``python first_updates.py FRAMEWORK REPORT``: for SGD (momentum, weight decay), Adam (coupled
weight decay) and AdamW (decoupled), every rank trains the same linear model, from the same
NumPy-drawn weights, through the framework adapter for three updates on its half of each global
batch, with a different LR each update; then a run with ``grad_accumulation=2`` whose middle
window is short (one micro-batch, weighted as the loop weights it). Rank 0 writes the weights
after every update. With FRAMEWORK=torch it also writes a one-process reference: plain
``torch.optim`` on the concatenated global batches, no Horovod.
"""

import json
import sys

import numpy as np

from hvdtrain import ArrayDataset, TrainTask, load_config

FRAMEWORK, REPORT = sys.argv[1], sys.argv[2]
FEATURES, CLASSES, PER_RANK = 8, 3, 4
LRS = [0.1, 0.3, 0.05]
OPTIMIZERS = {"sgd": ["optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01"],
              "adam": ["optim.name=adam", "optim.weight_decay=0.01"],
              "adamw": ["optim.name=adamw", "optim.weight_decay=0.01"]}
# the accumulation run: (micro-batch sizes per rank, apply after this micro-batch) per window
WINDOWS = [[4, 4], [2], [4, 4]]

rng = np.random.default_rng(7)
W0 = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32) * 0.5
B0 = rng.standard_normal(CLASSES).astype(np.float32) * 0.5
X = rng.standard_normal((64, FEATURES)).astype(np.float32)
Y = rng.integers(0, CLASSES, 64).astype(np.int64)


def global_batches(size):
    """Three global batches of PER_RANK samples per rank: rank r's slice and the whole."""
    return [np.arange(i * PER_RANK * size, (i + 1) * PER_RANK * size) for i in range(len(LRS))]


def window_batches(size):
    """Per window, per micro-batch: the global indices (all ranks), rank r's being the r-th slice."""
    start, out = 0, []
    for window in WINDOWS:
        micro = []
        for n in window:
            micro.append(np.arange(start, start + n * size).reshape(size, n))
            start += n * size
        out.append(micro)
    return out


def torch_side():
    import torch
    import torch.nn.functional as F

    from hvdtrain.torch import TorchAdapter, build_optimizer, decay_groups

    adapter = TorchAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))

    def model():
        m = torch.nn.Linear(FEATURES, CLASSES)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(W0))
            m.bias.copy_(torch.from_numpy(B0))
        return m

    def weights(m):
        return [m.weight.detach().numpy().tolist(), m.bias.detach().numpy().tolist()]

    def through_adapter(overrides, accumulation=1):
        config = load_config(overrides=[*overrides, f"train.grad_accumulation={accumulation}"])
        m = model()
        dummy = ArrayDataset(X[:2], Y[:2])
        task = TrainTask(m, build_optimizer(decay_groups(m, config.optim.weight_decay), config.optim),
                         F.cross_entropy, dummy, dummy, metric_sums=lambda out, y: {})
        adapter.prepare(task, config)
        adapter.broadcast_state()
        return m

    report = {"rank": ctx.rank, "adapter": {}, "reference": {}}
    for name, overrides in OPTIMIZERS.items():
        m, history = through_adapter(overrides), []
        for lr, idx in zip(LRS, global_batches(ctx.size)):
            mine = idx.reshape(ctx.size, PER_RANK)[ctx.rank]
            adapter.set_learning_rate(lr)
            adapter.train_step(X[mine], Y[mine], apply_update=True)
            history.append(weights(m))
        report["adapter"][name] = history
        # the reference: one process, the plain optimizer, the concatenated global batch
        ref, history = model(), []
        groups = [{"params": [ref.weight], "weight_decay": 0.01}, {"params": [ref.bias], "weight_decay": 0.0}]
        opt = {"sgd": lambda: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
               "adam": lambda: torch.optim.Adam(groups, lr=0.1),
               "adamw": lambda: torch.optim.AdamW(groups, lr=0.1)}[name]()
        for lr, idx in zip(LRS, global_batches(ctx.size)):
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            F.cross_entropy(ref(torch.from_numpy(X[idx])), torch.from_numpy(Y[idx])).backward()
            opt.step()
            history.append(weights(ref))
        report["reference"][name] = history

    plain_sgd = ["optim.name=sgd", "optim.momentum=0.0"]
    m, history = through_adapter(plain_sgd, accumulation=2), []
    ref, ref_history = model(), []
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    adapter.set_learning_rate(0.5)
    for window in window_batches(ctx.size):
        total = sum(len(micro[ctx.rank]) for micro in window)
        for i, micro in enumerate(window):
            mine = micro[ctx.rank]
            adapter.train_step(X[mine], Y[mine], apply_update=i == len(window) - 1, weight=len(mine) / total)
        history.append(weights(m))
        everything = np.concatenate([micro.reshape(-1) for micro in window])
        ref_opt.zero_grad()
        F.cross_entropy(ref(torch.from_numpy(X[everything])), torch.from_numpy(Y[everything])).backward()
        ref_opt.step()
        ref_history.append(weights(ref))
    report["adapter"]["accumulation"], report["reference"]["accumulation"] = history, ref_history
    return ctx, report


def tensorflow_side():
    import keras
    import tensorflow as tf

    from hvdtrain.tensorflow import TensorFlowAdapter, build_optimizer, low_rank_variables

    adapter = TensorFlowAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))

    def loss(logits, labels):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    def through_adapter(overrides, accumulation=1):
        config = load_config(overrides=[*overrides, f"train.grad_accumulation={accumulation}"])
        m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
        m.layers[0].kernel.assign(W0.T)
        m.layers[0].bias.assign(B0)
        dummy = ArrayDataset(X[:2], Y[:2])
        task = TrainTask(m, build_optimizer(config.optim, exclude_variables=low_rank_variables(m)), loss,
                         dummy, dummy, metric_sums=lambda out, y: {})
        adapter.prepare(task, config)
        adapter.broadcast_state()
        return m

    def weights(m):
        return [np.asarray(m.layers[0].kernel).T.tolist(), np.asarray(m.layers[0].bias).tolist()]

    report = {"rank": ctx.rank, "adapter": {}, "optimizer_lr": {}, "loss_types": []}
    for name, overrides in OPTIMIZERS.items():
        m, history, lrs = through_adapter(overrides), [], []
        for lr, idx in zip(LRS, global_batches(ctx.size)):
            mine = idx.reshape(ctx.size, PER_RANK)[ctx.rank]
            adapter.set_learning_rate(lr)
            step_loss = adapter.train_step(X[mine], Y[mine], apply_update=True)
            history.append(weights(m))
            # the step assigned the LR inside its graph: the optimizer's variable (checkpointed) holds it
            lrs.append([lr, float(adapter.optimizer.learning_rate.numpy())])
            report["loss_types"].append(f"{type(step_loss).__module__}.{type(step_loss).__name__}")
        report["adapter"][name] = history
        report["optimizer_lr"][name] = lrs
    m, history = through_adapter(["optim.name=sgd", "optim.momentum=0.0"], accumulation=2), []
    adapter.set_learning_rate(0.5)
    for window in window_batches(ctx.size):
        total = sum(len(micro[ctx.rank]) for micro in window)
        for i, micro in enumerate(window):
            mine = micro[ctx.rank]
            adapter.train_step(X[mine], Y[mine], apply_update=i == len(window) - 1, weight=len(mine) / total)
        history.append(weights(m))
    report["adapter"]["accumulation"] = history
    return ctx, report


ctx, report = torch_side() if FRAMEWORK == "torch" else tensorflow_side()
if ctx.rank == 0:
    with open(REPORT, "w") as f:
        json.dump({"world_size": ctx.size, **report}, f)
