"""Compression item: bytes each rank writes to its Gloo sockets per training step (/proc/self/io
``wchar``, as item 7 measures fp16) with one ``comm`` setting, for one framework and model.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/compression_bytes.py \
        torch|tensorflow small_cnn|resnet18 OUT.json [KEY=VALUE ...]
"""

from __future__ import annotations

import sys
import time

import common  # noqa: F401  (puts the repository on sys.path)
from hvdtrain.tools.bench import BenchSettings
from hvdtrain.core.resolve import load_config

WARMUP, STEPS = 2, 6


def wchar() -> int:
    """Bytes this process has passed to write()/writev() so far (Gloo sends with writev)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def main() -> None:
    framework, model, out, overrides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    config = load_config(None, overrides=[f"model.name={model}", "train.batch_size=32", "train.threads=1",
                                          "model.num_classes=10", *overrides], framework=framework)
    if framework == "torch":
        import horovod.torch as hvd
        from hvdtrain.torch.adapter import TorchAdapter as Adapter
        from hvdtrain.torch.bench import synthetic_task, to_device
    else:
        import horovod.tensorflow as hvd
        from hvdtrain.tensorflow.adapter import TensorFlowAdapter as Adapter
        from hvdtrain.tensorflow.bench import synthetic_task, to_device
    adapter = Adapter()
    adapter.init(config)
    task = synthetic_task(config, BenchSettings(image_size=32, channels=1))
    adapter.prepare(task, config)
    adapter.broadcast_state()
    adapter.set_learning_rate(0.01)
    batch = to_device(adapter, task.train_data.inputs, task.train_data.targets)
    for _ in range(WARMUP):
        adapter.train_step(*batch)
    adapter.barrier()
    before, started = wchar(), time.perf_counter()
    for _ in range(STEPS):
        adapter.train_step(*batch)
    written, elapsed = wchar() - before, time.perf_counter() - started
    if framework == "torch":
        params = sum(p.numel() for p in adapter.model.parameters())
    else:
        params = sum(int(v.numpy().size) for v in adapter.model.trainable_variables)
    per_rank = adapter.allgather_object({"wire_bytes_per_step": written / STEPS, "step_sec": elapsed / STEPS})
    if hvd.rank() == 0:
        common.write_json(out, {"framework": framework, "model": model, "overrides": overrides, "params": params,
                                "gradient_bytes": 4 * params, "world_size": hvd.size(), "ranks": per_rank})


if __name__ == "__main__":
    main()
