"""hvdtrain.core.compression: the comm keys for PowerSGD, top-k and local SGD, the combinations the
one validation pass refuses, and the framework-neutral pieces of the algorithms."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.core.compression import CommPlan, comm_plan, compressible, effective_rank, initial_q, matrix_shape, \
    topk_count
from hvdtrain.core.rules import fp16_allreduce as uses_fp16_allreduce
from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config


def test_defaults_leave_horovods_allreduce_in_charge():
    config = load_config()
    assert config.comm.compression == "none" and config.comm.local_sgd_steps == 1
    assert comm_plan(config) is None and not uses_fp16_allreduce(config)


@pytest.mark.parametrize("overrides, method", [
    (["comm.compression=powersgd"], "powersgd"),
    (["comm.compression=topk", "comm.topk_ratio=0.001"], "topk"),
    (["comm.local_sgd_steps=4", "comm.local_sgd_average_optimizer=true"], "local_sgd"),
])
def test_options_select_hvdtrains_exchange(overrides, method):
    plan = comm_plan(load_config(overrides=overrides))
    assert plan is not None and plan.method == method


def test_local_sgd_one_step_is_synchronous_sgd():
    assert comm_plan(load_config(overrides=["comm.local_sgd_steps=1"])) is None


def test_fp16_spellings_agree_and_compose_with_powersgd():
    assert uses_fp16_allreduce(load_config(overrides=["comm.compression=fp16"]))
    assert uses_fp16_allreduce(load_config(overrides=["train.fp16_allreduce=true"]))
    assert comm_plan(load_config(overrides=["comm.compression=fp16"])) is None
    plan = comm_plan(load_config(overrides=["comm.compression=powersgd", "train.fp16_allreduce=true"]))
    assert plan.fp16_wire


@pytest.mark.parametrize("overrides, parts", [
    (["comm.compression=powersgd", "comm.reduction=adasum"], ["comm.compression=powersgd", "adasum"]),
    (["comm.compression=topk", "comm.reduction=adasum"], ["comm.compression=topk", "adasum"]),
    (["comm.local_sgd_steps=4", "comm.reduction=adasum"], ["comm.local_sgd_steps=4", "adasum"]),
    (["comm.local_sgd_steps=4", "comm.compression=topk"], ["comm.local_sgd_steps=4", "comm.compression=topk"]),
    (["comm.local_sgd_steps=2", "train.fp16_allreduce=true"], ["train.fp16_allreduce"]),
    (["comm.compression=powersgd", "train.mixed_precision=fp16"], ["train.mixed_precision"]),
    (["comm.compression=gzip"], ["comm.compression", "'gzip'", "powersgd", "topk"]),
    (["comm.topk_ratio=0"], ["comm.topk_ratio"]),
    (["comm.topk_ratio=1.5"], ["comm.topk_ratio"]),
    (["comm.powersgd_rank=0"], ["comm.powersgd_rank"]),
    (["comm.local_sgd_steps=0"], ["comm.local_sgd_steps"]),
    (["comm.powersgd_start_step=-1"], ["comm.powersgd_start_step"]),
])
def test_impossible_combinations_are_refused_naming_the_keys(overrides, parts):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    message = str(info.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)


def test_matrix_view_and_rank():
    assert matrix_shape((64, 32, 3, 3)) == (64, 288)
    assert matrix_shape((10, 784)) == (10, 784)
    assert effective_rank(10, 784, 4) == 4 and effective_rank(3, 784, 4) == 3
    plan = CommPlan("powersgd", powersgd_min_size=1000)
    assert compressible((64, 32, 3, 3), plan) and not compressible((64,), plan) and not compressible((10, 50), plan)


def test_initial_q_is_seeded_and_per_tensor():
    assert np.array_equal(initial_q(3, 50, 4), initial_q(3, 50, 4))
    assert not np.array_equal(initial_q(3, 50, 4), initial_q(4, 50, 4))
    assert initial_q(0, 50, 4).dtype == np.float32 and initial_q(0, 50, 4).shape == (50, 4)


def test_topk_count_sends_at_least_one():
    assert topk_count(1000, 0.01) == 10 and topk_count(10, 0.01) == 1 and topk_count(10, 1.0) == 10


# -- the exchange's per-rank state in the checkpoint (hvdtrain.core.exchange, compression_state) --------------

class _FakeExchange:
    """A NumPy exchange with state, as the adapters' PowerSGD/top-k/local SGD are to the checkpoint."""

    keeps_state = True
    plan = CommPlan("topk")

    def __init__(self, rank=0):
        self.rank, self.loaded, self.resets = rank, None, 0

    def state(self):
        return {"steps": np.asarray(3), f"error/{self.rank}": np.arange(4.0) + self.rank}

    def load_state(self, state):
        self.loaded = state

    def reset(self):
        self.resets += 1


class _FakeAdapter:
    """Rank 0 of two, seen from one: the gather to rank 0 returns rank 0's and rank 1's states, the
    scatter from rank 0 gives rank 0 its own."""

    def __init__(self, exchange):
        self.exchange = exchange

    def model_buffers(self):  # the adapter contract (hvdtrain.core.adapter.CORE_TOUCHES): no running statistics
        return None

    def gather_object_to_root(self, obj):
        return [obj, {**_FakeExchange(1).state(), "format": obj["format"]}]

    def scatter_objects_from_root(self, items):
        return items[0]

    def broadcast_object(self, obj, root_rank=0):
        return obj

    def context(self):
        from hvdtrain.core.adapter import DistContext

        return DistContext(rank=0, size=2)


def test_exchange_state_round_trips_through_the_checkpoint_with_its_format(tmp_path, capsys):
    from hvdtrain.core import compression_state
    from hvdtrain.core.exchange import STATE_FORMAT, state_format

    states = compression_state.gather(_FakeAdapter(_FakeExchange()))
    compression_state.write(tmp_path, states)
    read = compression_state.read(tmp_path, 2)
    assert [state_format(s) for s in read] == [STATE_FORMAT, STATE_FORMAT]
    assert np.array_equal(read[1]["error/1"], np.arange(4.0) + 1)
    exchange = _FakeExchange()
    plan = {"checkpoint": str(tmp_path), "manifest": {"world_size": 2}}
    compression_state.restore(_FakeAdapter(exchange), plan, rank=0, size=2)
    assert np.array_equal(exchange.loaded["error/0"], np.arange(4.0)) and exchange.resets == 0
    compression_state.restore(_FakeAdapter(exchange), plan, rank=0, size=4)
    assert exchange.resets == 1 and "written by 2 workers, this job has 4" in capsys.readouterr().out


def test_a_format_1_state_reads_as_format_1(tmp_path):
    from hvdtrain.core import compression_state
    from hvdtrain.core.exchange import indexed, state_format

    with open(tmp_path / compression_state.STATE_FILE, "wb") as f:  # as checkpoints before the format key
        np.savez(f, **{"0/steps": np.asarray(2), "0/error/3": np.ones(2), "1/steps": np.asarray(2)})
    read = compression_state.read(tmp_path, 2)
    assert [state_format(s) for s in read] == [1, 1]
    assert list(indexed(read[0], "error/")) == [3]


def test_an_exchange_without_state_writes_nothing_and_gathers_nothing(tmp_path):
    from hvdtrain.core import compression_state
    from hvdtrain.core.exchange import GradientExchange, Stateless

    class Plain(Stateless):
        def reduce(self, grads):
            return grads

    assert isinstance(Plain(), GradientExchange)
    adapter = _FakeAdapter(Plain())
    assert compression_state.gather(adapter) is None
    compression_state.write(tmp_path, None)
    assert not (tmp_path / compression_state.STATE_FILE).exists()
