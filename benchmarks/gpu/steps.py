"""One GPU, three training loops over the same model and batch, timed interleaved in one process.

* ``plain``: a hand-written PyTorch loop (autocast, channels-last for convolutions, GradScaler for
  fp16), what a user writes without a distributed library;
* ``horovod``: the same loop with Horovod's ``DistributedOptimizer`` (the loop of Horovod's
  ``pytorch_synthetic_benchmark.py``; at one rank its hooks and the NCCL allreduce still run);
* ``hvdtrain``: hvdtrain's torch adapter (``train_step`` as a training run calls it: the gradient
  exchange, the norm and finite check, the loss returned on the device).

The same optimizer (``build_optimizer`` from the config's ``optim`` section), the same fixed random
batch (ResNet-50 images or BERT token ids), cuDNN autotuning on. Each loop is warmed up, then the
loops take turns, ``--rounds`` times, each timing ``--steps`` steps between two device
synchronisations; the result is every round's samples/s per loop and the ratios of the medians.
``--profile`` also counts, for hvdtrain's step, the host synchronisations per step (CUDA runtime
synchronisations and device-to-host copies in PyTorch's profiler).

    python benchmarks/gpu/steps.py --model resnet50 --batch 256 --precision bf16 --json out.json
    python benchmarks/gpu/steps.py --model bert --batch 64 --precision bf16 --compile default

On a machine without a GPU it runs on the CPU (tiny sizes: a rehearsal of the script, no figure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SEED = 0


def build_model(name: str, size: int, classes: int, seq: int) -> torch.nn.Module:
    """ResNet-50 from the image recipe, or a BERT-base classifier (random weights, transformers)."""
    torch.manual_seed(SEED)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        small = size < 64  # CPU rehearsal: a 2-layer BERT
        config = BertConfig(num_labels=classes, max_position_embeddings=max(512, seq),
                            **({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                                "intermediate_size": 256} if small else {}))
        return BertForSequenceClassification(config)
    from hvdtrain_recipes.image_classification.torch_models import build_model as image_model

    return image_model(name, 3, (size, size), classes)


def batch(model_name: str, n: int, size: int, classes: int, seq: int) -> tuple[Any, np.ndarray]:
    rng = np.random.default_rng(SEED)
    targets = rng.integers(0, classes, size=n, dtype=np.int64)
    if model_name == "bert":
        ids = rng.integers(1000, 30000, size=(n, seq), dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones((n, seq), dtype=np.int64)}, targets
    return rng.standard_normal((n, 3, size, size), dtype=np.float32), targets


def logits_of(outputs: Any) -> torch.Tensor:
    return outputs.logits if hasattr(outputs, "logits") else outputs


def loss_fn(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits_of(outputs).float(), targets)


def config_for(args: argparse.Namespace, compile_mode: str) -> Any:
    from hvdtrain.core.resolve import load_config

    overrides = [f"train.mixed_precision={args.precision}", f"train.compile={compile_mode}",
                 "train.log_every=0", f"optim.name={args.optim}"]
    return load_config(None, None, overrides, recipe="image-classification", framework="torch",
                       model__name="resnet50", train__batch_size=args.batch)


def to_device(value: Any, device: torch.device, channels_last: bool) -> Any:
    if isinstance(value, dict):
        return {k: to_device(v, device, channels_last) for k, v in value.items()}
    tensor = torch.from_numpy(value).to(device)
    if channels_last and tensor.dim() == 4:
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def forward(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def plain_loop(args, config, device, x, y, horovod: bool) -> Callable[[], None]:
    """The hand-written loop; with ``horovod``, through Horovod's DistributedOptimizer."""
    import horovod.torch as hvd
    from hvdtrain.torch.adapter import build_optimizer

    model = build_model(args.model, args.size, args.classes, args.seq).to(device)
    convolutional = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    if device.type == "cuda" and convolutional and not horovod:  # Horovod takes default-layout tensors only
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model.parameters(), config.optim)
    if horovod:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=[(f"{args.tag}h.{n}", p)
                                                                          for n, p in model.named_parameters()])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step_model = model if args.compile == "none" else torch.compile(model, mode=args.compile)
    inputs = to_device(x, device, device.type == "cuda" and convolutional)
    targets = to_device(y, device, False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    model.train()

    def step() -> None:
        optimizer.zero_grad()
        with autocast():
            loss = loss_fn(forward(step_model, inputs), targets)
        if scaler is None:
            loss.backward()
            optimizer.step()
            return
        scaler.scale(loss).backward()
        if horovod:
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()

    return step


class FixedBatch:
    """A dataset of one fixed batch with dict inputs (the steps never read it: a TrainTask needs one)."""

    def __init__(self, inputs: dict, targets: np.ndarray) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[dict, np.ndarray]:
        return {k: v[indices] for k, v in self.inputs.items()}, self.targets[indices]


def hvdtrain_loop(args, config, x, y) -> tuple[Callable[[], None], Any]:
    """hvdtrain's torch adapter on a TrainTask of the same model and batch."""
    from hvdtrain.core.adapter import load_adapter
    from hvdtrain.core.task import ArrayDataset, TrainTask
    from hvdtrain.torch.adapter import build_optimizer

    adapter = load_adapter("torch")
    adapter.init(config)
    model = build_model(args.model, args.size, args.classes, args.seq)
    data = ArrayDataset(x, y) if isinstance(x, np.ndarray) else FixedBatch(x, y)
    task = TrainTask(model=model, optimizer=build_optimizer(model.parameters(), config.optim), loss_fn=loss_fn,
                     train_data=data, val_data=data,
                     metric_sums=lambda out, t: {"correct": (logits_of(out).argmax(dim=1) == t).sum()})
    adapter.prepare(task, config)
    adapter.broadcast_state(root_rank=0)
    adapter.set_learning_rate(config.optim.lr)
    inputs, targets = adapter._move(x), adapter._to_device(y)
    return (lambda: adapter.train_step(inputs, targets)), adapter


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_syncs(step: Callable[[], None], steps: int) -> dict[str, float]:
    """Per step: CUDA synchronisation calls and device-to-host copies seen by PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    counts: dict[str, float] = {}
    for event in prof.events():
        name = event.name
        if "Synchronize" in name or "DtoH" in name or name in ("aten::item", "aten::_local_scalar_dense"):
            counts[name] = counts.get(name, 0) + 1
    return {k: v / steps for k, v in sorted(counts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=("resnet50", "resnet18", "bert"))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224, help="image side (bert: under 64 means a tiny BERT)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--precision", default="bf16", choices=("none", "bf16", "fp16"))
    parser.add_argument("--compile", default="none", choices=("none", "default"))
    parser.add_argument("--optim", default="sgd", choices=("sgd", "adamw"))
    parser.add_argument("--loops", default="plain,horovod,hvdtrain")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tag", default="", help="prefix of Horovod tensor names")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import horovod.torch as hvd

    hvd.init()
    torch.backends.cudnn.benchmark = True
    config = config_for(args, args.compile)
    if args.model == "bert":
        args.classes = 2
    x, y = batch(args.model, args.batch, args.size, args.classes, args.seq)
    loops: dict[str, Callable[[], None]] = {}
    adapter = None
    names = args.loops.split(",")
    for name in names:  # hvdtrain's adapter first: its init picks and sets the device
        if name == "hvdtrain":
            loops[name], adapter = hvdtrain_loop(args, config, x, y)
    device = adapter.device if adapter is not None else (
        torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    for name in names:
        if name in ("plain", "horovod"):
            loops[name] = plain_loop(args, config, device, x, y, horovod=name == "horovod")
    loops = {name: loops[name] for name in names}
    first_step: dict[str, float] = {}
    for name, step in loops.items():
        started = time.perf_counter()
        step()
        sync(device)
        first_step[name] = time.perf_counter() - started
        for _ in range(args.warmup):
            step()
        sync(device)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    order = list(loops)
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:  # each loop leads a round in turn
            sync(device)
            started = time.perf_counter()
            for _ in range(args.steps):
                loops[name]()
            sync(device)
            rates[name].append(args.batch * args.steps / (time.perf_counter() - started))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result: dict[str, Any] = {
        "model": args.model, "batch": args.batch, "size": args.size, "seq": args.seq, "precision": args.precision,
        "compile": args.compile, "optim": args.optim, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "rates": rates, "median": medians, "first_step_s": first_step,
        "ratios": {f"hvdtrain/{n}": medians["hvdtrain"] / medians[n] for n in medians
                   if n != "hvdtrain" and "hvdtrain" in medians},
        "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if args.profile and device.type == "cuda" and "hvdtrain" in loops:
        result["hvdtrain_host_syncs_per_step"] = host_syncs(loops["hvdtrain"], 5)
        if "plain" in loops:
            result["plain_host_syncs_per_step"] = host_syncs(loops["plain"], 5)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    summary = ", ".join(f"{n} {m:,.1f}/s" for n, m in medians.items())
    ratios = ", ".join(f"{k} {v:.3f}" for k, v in result["ratios"].items())
    print(f"[steps] {args.model} b{args.batch} {args.precision} compile={args.compile}: {summary}; {ratios}")


if __name__ == "__main__":
    main()
