"""Compiled against eager steps (``train.compile``, issue 27 item 1), interleaved, both frameworks.

For each model (the image recipe's ResNet-18 and ResNet-50 on small synthetic images, the BERT
recipe's model: its embedded all-MiniLM-L6-v2 with a fresh head, on synthetic token ids) four
training loops run side by side in one process, round after round (A, B, C, D, A, B, ...), on
the same fixed batch (Horovod's synthetic-benchmark style: the loader is not measured):

* ``hvdtrain-eager`` / ``hvdtrain-compiled``: the framework adapter's ``train_step`` with
  ``train.compile=none`` / ``default`` (or ``--mode``);
* ``hand-eager`` / ``hand-compiled``: a hand-written Horovod loop (``hvd.DistributedOptimizer`` in
  torch, ``hvd.allreduce`` of the tape's gradients in TensorFlow), the compiled one with
  ``torch.compile(model)`` / an inner ``tf.function(jit_compile=True)`` for forward + gradient:
  what a user would write by hand.

Each loop's first step (where compilation happens) is timed apart and reported as its compile
time; the rounds give samples/s per rank (median over rounds) and CPU-seconds per sample (this
process's user + system time, which load on other processes does not distort). Ratios:
``compiled/eager`` (hvdtrain's) and ``hvdtrain/hand`` (compiled).

    python benchmarks/compile_speed.py --framework torch --models resnet18,resnet50,bert
    horovodrun -np 2 -H localhost:2 python benchmarks/compile_speed.py --framework tensorflow
    python benchmarks/compile_speed.py --framework torch --no-horovod --device cuda   # a GPU, no Horovod

``--no-horovod`` runs only the two hand-written loops without Horovod (plain PyTorch, eager and
compiled): what a GPU machine without Horovod or TensorFlow can measure. It imports no hvdtrain
module (the ResNets are loaded from their file, which needs only torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from common import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
CLASSES = 100
SEQUENCE = 128



def _load_file(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batch_arrays(model: str, batch: int, size: int, channels_first: bool) -> tuple[Any, np.ndarray]:
    """One fixed synthetic batch: images (NCHW or NHWC) or BERT token ids, and labels."""
    rng = np.random.default_rng(0)
    if model == "bert":
        ids = rng.integers(1000, 30000, (batch, SEQUENCE)).astype(np.int64)
        return {"ids": ids, "mask": np.ones_like(ids), "segments": np.zeros_like(ids)}, \
            rng.integers(0, 2, batch).astype(np.int64)
    shape = (batch, 3, size, size) if channels_first else (batch, size, size, 3)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, CLASSES, batch).astype(np.int64)


# -- PyTorch -------------------------------------------------------------------------------------

def torch_model(name: str, size: int, pretrained: bool = True) -> Any:
    """The recipe's model, seeded alike for every loop (BERT without ``pretrained``: its
    architecture, randomly initialised, for a machine without hvdtrain's packages)."""
    import torch

    torch.manual_seed(0)
    if name == "bert":
        return torch_bert(pretrained)
    models = _load_file("torch_models", REPO / "hvdtrain_recipes" / "image_classification" / "torch_models.py")
    return models.build_model(name, 3, (size, size), CLASSES)


def torch_bert(pretrained: bool) -> Any:
    """The BERT recipe's model (all-MiniLM-L6-v2 + a 2-class head) taking ``ids, mask, segments``."""
    import torch
    import transformers

    if pretrained:
        from hvdtrain_recipes.bert_finetune.pretrained import embedded_model_dir
        model = transformers.AutoModelForSequenceClassification.from_pretrained(embedded_model_dir(), num_labels=2)
    else:  # the same architecture (all-MiniLM-L6-v2's config), randomly initialised
        config = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                         intermediate_size=1536, num_labels=2)
        model = transformers.BertForSequenceClassification(config)

    class Logits(torch.nn.Module):
        """Plain logits from the three token tensors."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask, segments):
            return self.inner(input_ids=ids, attention_mask=mask, token_type_ids=segments).logits

    return Logits(model)


def torch_call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def torch_hand_loop(name: str, size: int, compiled: bool, inputs: Any, labels: Any, device: str,
                    horovod: bool, mode: str) -> Callable[[], None]:
    """A hand-written (Horovod) loop's step: SGD with momentum, ``torch.compile(model)`` if compiled."""
    import torch
    import torch.nn.functional as F

    model = torch_model(name, size, pretrained=horovod).to(device)
    model.train()  # as the adapter does (from_pretrained returns a model in eval mode: no dropout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if horovod:
        import horovod.torch as hvd
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())  # distributed
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # distributed
    step_model = torch.compile(model, mode=None if mode == "default" else mode) if compiled else model
    x = {k: torch.from_numpy(v).to(device) for k, v in inputs.items()} if isinstance(inputs, dict) \
        else torch.from_numpy(inputs).to(device)
    y = torch.from_numpy(labels).to(device)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(torch_call(step_model, x), y).backward()
        optimizer.step()

    return step


def hvdtrain_config(framework: str, mode: str, threads: int) -> Any:
    """The config both hvdtrain sides run with: ``train.compile=mode``, SGD with momentum."""
    from hvdtrain import load_config

    overrides = [f"train.compile={mode}", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.01",
                 f"train.threads={threads}"]
    return load_config(overrides=overrides, framework=framework)


def torch_hvdtrain_loop(name: str, size: int, compiled: bool, inputs: Any, labels: Any, mode: str,
                        threads: int) -> Callable[[], None]:
    """hvdtrain's TorchAdapter step with ``train.compile``."""
    import torch.nn.functional as F

    from hvdtrain import ArrayDataset, TrainTask
    from hvdtrain.torch import TorchAdapter
    from hvdtrain.torch.adapter import build_optimizer

    config = hvdtrain_config("torch", mode if compiled else "none", threads)
    adapter = TorchAdapter()
    adapter.init(config)
    model = torch_model(name, size)
    dummy = ArrayDataset(np.zeros((2, 1), np.float32), np.zeros(2, np.int64))
    task = TrainTask(model, build_optimizer(model.parameters(), config.optim), F.cross_entropy, dummy, dummy,
                     metric_sums=lambda out, y: {})
    adapter.prepare(task, config)
    adapter.broadcast_state()

    def step() -> None:
        adapter.train_step(inputs, labels)

    return step


# -- TensorFlow ----------------------------------------------------------------------------------

def keras_model(name: str, size: int) -> Any:
    """The recipe's Keras model, seeded alike for every loop; BERT takes ``ids, mask, segments``."""
    import keras

    keras.utils.set_random_seed(0)
    if name != "bert":
        from hvdtrain_recipes.image_classification.keras_models import build_model
        return build_model(name, (size, size, 3), CLASSES)
    import keras_hub

    from hvdtrain_recipes.bert_finetune.pretrained import embedded_model_dir
    backbone = keras_hub.models.BertBackbone.from_preset(str(embedded_model_dir()))
    classifier = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None)
    ids = keras.Input((SEQUENCE,), dtype="int32", name="ids")
    mask = keras.Input((SEQUENCE,), dtype="int32", name="mask")
    segments = keras.Input((SEQUENCE,), dtype="int32", name="segments")
    logits = classifier({"token_ids": ids, "padding_mask": mask, "segment_ids": segments})
    return keras.Model({"ids": ids, "mask": mask, "segments": segments}, logits)


def keras_loss(logits: Any, labels: Any) -> Any:
    import keras
    import tensorflow as tf

    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def tf_inputs(inputs: Any) -> Any:
    import tensorflow as tf

    if isinstance(inputs, dict):
        return {k: tf.constant(v.astype(np.int32)) for k, v in inputs.items()}
    return tf.constant(inputs)


def tf_hand_loop(name: str, size: int, compiled: bool, inputs: Any, labels: Any) -> Callable[[], None]:
    """A hand-written Horovod step: the tape's gradients allreduced (``hvd.grouped_allreduce``)
    and applied; compiled: forward + gradient in an inner ``tf.function(jit_compile=True)``."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    model = keras_model(name, size)
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    variables = [getattr(v, "value", v) for v in model.trainable_variables]
    hvd.broadcast_variables([getattr(v, "value", v) for v in model.variables + optimizer.variables], 0)  # distributed

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = keras_loss(model(x, training=True), y)
        return loss, tape.gradient(loss, variables)

    local = tf.function(gradients, jit_compile=True) if compiled else gradients

    @tf.function(reduce_retracing=True)
    def step(x, y):
        loss, grads = local(x, y)
        grads = [tf.convert_to_tensor(g) for g in grads]
        if hvd.size() > 1:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)  # distributed
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = tf_inputs(inputs), tf.constant(labels)
    return lambda: step(x, y).numpy()


def tf_hvdtrain_loop(name: str, size: int, compiled: bool, inputs: Any, labels: Any, threads: int) -> Callable:
    """hvdtrain's TensorFlowAdapter step with ``train.compile``."""
    from hvdtrain import ArrayDataset, TrainTask
    from hvdtrain.tensorflow import TensorFlowAdapter, build_optimizer

    config = hvdtrain_config("tensorflow", "default" if compiled else "none", threads)
    adapter = TensorFlowAdapter()
    adapter.init(config)
    model = keras_model(name, size)
    dummy = ArrayDataset(np.zeros((2, 1), np.float32), np.zeros(2, np.int64))  # the Keras models are built
    task = TrainTask(model, build_optimizer(config.optim), keras_loss, dummy, dummy, metric_sums=lambda o, t: {})
    adapter.prepare(task, config)
    adapter.broadcast_state()
    x = {k: v.astype(np.int32) for k, v in inputs.items()} if isinstance(inputs, dict) else inputs
    return lambda: adapter.train_step(x, labels).numpy()


# -- the measurement -----------------------------------------------------------------------------

def measure(loops: dict[str, Callable[[], None]], rounds: int, steps: int, batch: int,
            sync: Callable[[], None]) -> dict[str, dict[str, Any]]:
    """Compile time (the first step), then ``rounds`` interleaved rounds of ``steps`` steps each."""
    results: dict[str, dict[str, Any]] = {}
    for name, step in loops.items():
        started = time.perf_counter()
        step()
        sync()
        results[name] = {"first_step_s": time.perf_counter() - started, "rates": [], "cpu_per_sample": []}
        step()  # a second step: recompilations for the steady state (e.g. the optimizer state now exists)
        sync()
    for _ in range(rounds):
        for name, step in loops.items():
            started, cpu = time.perf_counter(), cpu_seconds()
            for _ in range(steps):
                step()
            sync()
            elapsed = time.perf_counter() - started
            results[name]["rates"].append(steps * batch / elapsed)
            results[name]["cpu_per_sample"].append((cpu_seconds() - cpu) / (steps * batch))
    for result in results.values():
        result["samples_per_s"] = statistics.median(result["rates"])
        result["cpu_s_per_sample"] = statistics.median(result["cpu_per_sample"])
    return results


def ratios(results: dict[str, dict[str, Any]], rounds: int) -> dict[str, float]:
    """Compiled/eager and hvdtrain/hand, each the median of the per-round ratios: of samples/s, and
    (``... (CPU)``) of samples per CPU-second."""
    out = {}
    pairs = {"compiled/eager hvdtrain": ("hvdtrain-compiled", "hvdtrain-eager"),
             "compiled/eager hand": ("hand-compiled", "hand-eager"),
             "hvdtrain/hand compiled": ("hvdtrain-compiled", "hand-compiled"),
             "hvdtrain/hand eager": ("hvdtrain-eager", "hand-eager")}
    for label, (a, b) in pairs.items():
        if a in results and b in results:
            out[label] = statistics.median(results[a]["rates"][i] / results[b]["rates"][i] for i in range(rounds))
            # the same ratio in samples per CPU-second: what load on other processes does not distort
            out[f"{label} (CPU)"] = statistics.median(
                results[b]["cpu_per_sample"][i] / results[a]["cpu_per_sample"][i] for i in range(rounds))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--models", default="resnet18,resnet50,bert", help="comma-separated: resnet18, resnet50, bert")
    parser.add_argument("--image-size", type=int, default=64, help="square image side (synthetic images)")
    parser.add_argument("--batch", type=int, default=16, help="samples per step and rank (BERT: sequences of 128)")
    parser.add_argument("--steps", type=int, default=5, help="steps per loop and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--mode", default="default", help="torch.compile mode (torch)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process (CPU)")
    parser.add_argument("--no-horovod", action="store_true", help="plain PyTorch, hand-written loops only")
    parser.add_argument("--device", default="cpu", help="torch device for --no-horovod (cpu or cuda)")
    parser.add_argument("--out", help="write the results as JSON here (rank 0)")
    args = parser.parse_args()
    if args.no_horovod and args.framework != "torch":
        parser.error("--no-horovod measures PyTorch only: use --framework torch")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    rank, sync = 0, (lambda: None)
    if args.framework == "torch":
        import torch
        torch.set_num_threads(args.threads)
        if args.device.startswith("cuda"):
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            sync = torch.cuda.synchronize
        if not args.no_horovod:
            import horovod.torch as hvd
            hvd.init()
            rank = hvd.rank()
    else:
        import horovod.tensorflow as hvd
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        hvd.init()
        rank = hvd.rank()

    report: dict[str, Any] = {"framework": args.framework, "image_size": args.image_size, "batch": args.batch,
                              "steps": args.steps, "rounds": args.rounds, "mode": args.mode,
                              "device": args.device, "horovod": not args.no_horovod, "models": {}}
    if args.framework == "torch":
        import torch
        report["torch"] = torch.__version__
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name()
    for name in args.models.split(","):
        if name == "bert" and importlib.util.find_spec("transformers") is None:
            print("bert: skipped, transformers is not installed here", flush=True)
            continue
        inputs, labels = batch_arrays(name, args.batch, args.image_size, args.framework == "torch")
        loops: dict[str, Callable[[], None]] = {}
        for compiled in (False, True):
            kind = "compiled" if compiled else "eager"
            if args.framework == "torch":
                if not args.no_horovod:
                    loops[f"hvdtrain-{kind}"] = torch_hvdtrain_loop(name, args.image_size, compiled, inputs, labels,
                                                                    args.mode, args.threads)
                loops[f"hand-{kind}"] = torch_hand_loop(name, args.image_size, compiled, inputs, labels, args.device,
                                                        not args.no_horovod, args.mode)
            else:
                loops[f"hvdtrain-{kind}"] = tf_hvdtrain_loop(name, args.image_size, compiled, inputs, labels,
                                                             args.threads)
                loops[f"hand-{kind}"] = tf_hand_loop(name, args.image_size, compiled, inputs, labels)
        results = measure(loops, args.rounds, args.steps, args.batch, sync)
        report["models"][name] = {"loops": results, "ratios": ratios(results, args.rounds)}
        if rank == 0:
            print(f"{args.framework} {name} (batch {args.batch}{'' if name == 'bert' else f', {args.image_size} px'}, "
                  f"{args.device}):", flush=True)
            for loop, result in results.items():
                print(f"  {loop:18s} {result['samples_per_s']:9.1f} samples/s  {result['cpu_s_per_sample'] * 1e3:8.2f} "
                      f"CPU-ms/sample  first step {result['first_step_s']:7.1f} s", flush=True)
            for label, value in report["models"][name]["ratios"].items():
                print(f"  {label:30s} {value:.3f}", flush=True)
        if rank == 0 and args.out:  # after every model: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
