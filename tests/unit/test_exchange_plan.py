"""hvdtrain.core.exchange_plan: the one decision of which gradient exchange runs, and the one
resolution of float16 on the wire (``comm.compression=fp16`` or its alias ``train.fp16_allreduce``)."""

from __future__ import annotations

import pytest

from hvdtrain.core.exchange_plan import KINDS, ExchangePlan, Workers, describe, plan_exchange
from hvdtrain.core.resolve import load_config

CPU_FULL = Workers(size=2, local_size=2, gpu=False, threads=1, cores=2)  # the cores are taken
CPU_SPARE = Workers(size=2, local_size=2, gpu=False, threads=1, cores=4)  # a core left over: overlap


@pytest.mark.parametrize("overrides, kind", [
    ([], "flat"),
    (["comm.flat_gradients=false"], "allreduce"),
    (["framework=tensorflow"], "allreduce"),
    (["parallel.shard_optimizer=optimizer"], "zero1"),
    (["parallel.shard_optimizer=gradients"], "zero2"),
    (["comm.compression=powersgd"], "powersgd"),
    (["comm.compression=topk"], "topk"),
    (["comm.local_sgd_steps=4"], "local_sgd"),
    (["train.reproducible=world-size", "train.global_batch_size=64"], "bitwise"),
])
def test_each_kind_from_its_keys(overrides, kind):
    plan = plan_exchange(load_config(overrides=overrides), CPU_FULL)
    assert plan.kind == kind and plan.kind in KINDS
    assert plan.sharded == (kind in ("zero1", "zero2"))
    assert (plan.comm is not None) == (kind in ("powersgd", "topk", "local_sgd"))


def test_overlap_and_adasum_only_for_horovods_allreduce():
    overlapped = plan_exchange(load_config(), CPU_SPARE)
    assert overlapped.kind == "allreduce" and overlapped.overlap  # overlap: Horovod's hooks, no flat buffers
    assert not plan_exchange(load_config(overrides=["comm.compression=powersgd"]), CPU_SPARE).overlap
    assert not plan_exchange(load_config(overrides=["parallel.shard_optimizer=gradients"]), CPU_SPARE).overlap
    adasum = plan_exchange(load_config(overrides=["comm.reduction=adasum"]), CPU_FULL)
    assert adasum.kind == "allreduce" and adasum.adasum
    assert not plan_exchange(load_config(overrides=["comm.reduction=adasum"]), Workers(size=1)).adasum


@pytest.mark.parametrize("overrides, overlap", [
    ([], False),  # PyTorch: one flat buffer reduced after the backward pass
    (["framework=tensorflow"], True),  # no flat buffer: each gradient's allreduce starts during the backward pass
    (["comm.flat_gradients=false"], True),
    (["framework=tensorflow", "comm.overlap=never"], False),
    (["comm.overlap=always"], True),
])
def test_auto_overlaps_on_a_full_cpu_unless_a_flat_buffer_replaces_it(overrides, overlap):
    plan = plan_exchange(load_config(overrides=overrides), CPU_FULL)
    assert plan.overlap is overlap
    assert (plan.kind == "flat") is (not overlap and "framework=tensorflow" not in overrides)


@pytest.mark.parametrize("overrides, fp16", [
    ([], False),
    (["comm.compression=fp16"], True),
    (["train.fp16_allreduce=true"], True),
    (["comm.compression=powersgd", "train.fp16_allreduce=true"], True),
    (["comm.compression=topk"], False),
    (["parallel.shard_optimizer=gradients", "train.fp16_allreduce=true"], True),
])
def test_fp16_on_the_wire_is_resolved_once_into_the_plan(overrides, fp16):
    plan = plan_exchange(load_config(overrides=overrides), CPU_FULL)
    assert plan.fp16_wire is fp16
    if plan.comm is not None:
        assert plan.comm.fp16_wire is fp16


def test_the_plan_is_frozen_and_described():
    plan = ExchangePlan("zero2", fp16_wire=True)
    with pytest.raises(AttributeError):
        plan.kind = "flat"  # type: ignore[misc]
    assert describe(plan) == "zero2 (fp16 on the wire)" and describe(ExchangePlan("flat")) == "flat"


def test_the_adapters_hold_no_choice_of_their_own():
    """The adapters and prepare() read the plan; none resolves fp16 or chooses an exchange itself."""
    from pathlib import Path

    import hvdtrain

    root = Path(hvdtrain.__file__).parent
    for name in ("torch/adapter.py", "tensorflow/adapter.py", "torch/prepare.py", "torch/stage.py",
                 "tensorflow/stage.py"):
        text = (root / name).read_text()
        for banned in ("fp16_allreduce(", "comm_plan(", "shard_optimizer ==", "shard_optimizer !=", "self.sharded",
                       "ShardedOptimizer(", "FlatReduceScatter(", "isinstance(self.exchange",
                       "isinstance(self.optimizer"):
            assert banned not in text, f"{name} holds {banned!r}: the exchange is chosen by hvdtrain.core.exchange_plan"
