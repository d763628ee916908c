"""The ``comm`` config section turned into what Horovod needs: environment variables read at
``hvd.init()``, and whether gradients are reduced while the
backward pass runs or all together after it. Framework-neutral; both adapters use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def horovod_comm_variables(comm: Any) -> dict[str, str]:
    """The Horovod environment variables a :class:`~hvdtrain.core.config.CommConfig` sets.

    Options left at None/false are absent, so what ``horovodrun`` (``--fusion-threshold-mb``,
    ``--timeline-filename``, ``--autotune``, ...) or the user exported stays in force.
    """
    env: dict[str, str] = {}
    if comm.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(round(comm.fusion_threshold_mb * 1024 * 1024)))
    if comm.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{comm.cycle_time_ms:g}"
    if comm.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if comm.autotune_log:
        env["HOROVOD_AUTOTUNE_LOG"] = str(Path(comm.autotune_log).expanduser().absolute())
    if comm.timeline:
        env["HOROVOD_TIMELINE"] = str(Path(comm.timeline).expanduser().absolute())
    if comm.timeline_mark_cycles:
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    return env


def overlap_gradients(comm: Any, gpu: bool, workers_per_host: int, threads: int, cores: int,
                      flat_buffer: bool) -> bool:
    """Whether each gradient is allreduced as soon as the backward pass produces it (Horovod's
    default) rather than all together after it.

    ``comm.overlap='auto'`` overlaps, as Horovod does, except where the run can reduce one flat
    gradient buffer after the backward pass instead (``flat_buffer``: PyTorch's data parallelism
    with ``comm.flat_gradients``) on a CPU whose cores the workers' intra-op threads already fill.
    There Gloo's allreduce is CPU work (copies, sums, loopback or NIC transfers) that can only
    compete with the backward pass it overlaps, and the flat buffer has no fusion-buffer copies to
    make. Where the alternative would be Horovod's grouped allreduce (TensorFlow, or PyTorch without
    flat buffers), overlapping measured faster on the same full CPU (BENCHMARKS.md, "Your own
    script"), and on GPUs or with a spare core overlap is free.
    """
    if comm.overlap != "auto":
        return comm.overlap == "always"
    return gpu or workers_per_host * threads < cores or not flat_buffer
