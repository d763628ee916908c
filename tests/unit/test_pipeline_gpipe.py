"""The framework-neutral GPipe driver (:mod:`hvdtrain.core.gpipe`) on a NumPy stage, in one process:
S x R ranks are threads whose collectives meet by name in an in-memory world.

A step of the driver equals one step of the un-cut model on the replica's batch (every micro-batch
split, with and without clipping by the global norm); every rank calls the same collectives in the
same order within each set (a mismatch would leave a rendezvous waiting, which fails the test);
gather -> save -> load -> broadcast restores every stage; a non-finite gradient is skipped on every
rank or raises on every rank; evaluation reports the last stage's sums under the same keys everywhere.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hvdtrain.core.adapter import NonFiniteGradientError
from hvdtrain.core.gpipe import PIPELINED, GPipe, Placement, pipelined, slice_batch
from hvdtrain.core.pipeline import Layout, stage_blocks

WIDTH, BLOCKS, LR = 3, 4, 0.1


class World:
    """Collectives by name over sets of ranks (tuples), for threads standing in for ranks."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.slots: dict[tuple, dict[int, object]] = {}
        self.calls: dict[int, int] = {}
        self.log: dict[int, list[tuple[str, tuple[int, ...]]]] = {r: [] for r in range(size)}

    def meet(self, rank: int, ranks: tuple[int, ...], name: str, value: object) -> dict[int, object]:
        """Every rank of ``ranks`` calls this with the same ``name``; each gets every rank's value."""
        self.log[rank].append((name, ranks))
        seq = sum(1 for entry in self.log[rank] if entry == (name, ranks))
        key = (name, ranks, seq)
        with self.cond:
            slot = self.slots.setdefault(key, {})
            slot[rank] = value
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: len(self.slots[key]) >= len(ranks), timeout=20):
                raise TimeoutError(f"rank {rank}: collective {name} on {ranks} was not joined by every rank")
            return dict(self.slots[key])


class NumpyStage:
    """The stage primitives for blocks ``y = tanh(x @ W)`` and the loss ``0.5 * mean ||y - t||^2``."""

    def __init__(self, world: World, placement: Placement, weights: list[np.ndarray], bounds: list[int]):
        self.world, self.placement = world, placement
        self.own = list(stage_blocks(bounds, BLOCKS, placement.stage))
        self.weights = {b: weights[b].copy() for b in self.own}
        self.skipped = 0
        self.sums: list[np.ndarray] = []

    def _meet(self, ranks, name, value):
        return self.world.meet(self.placement.rank, tuple(ranks), name, value)

    def begin(self, inputs, targets, training):
        self.sums = [np.zeros_like(self.weights[b]) for b in self.own]
        return inputs, targets, len(targets)

    def forward(self, x, inputs, targets, weight, training):
        acts = [x]
        for b in self.own:
            acts.append(np.tanh(acts[-1] @ self.weights[b]))
        return (acts, targets, weight), acts[-1]

    def backward(self, saved, y, grad):
        acts, targets, weight = saved
        loss = None
        if grad is None:
            loss = float(0.5 * np.mean(np.sum((y - targets) ** 2, axis=1)))
            grad = weight * (y - targets) / len(targets)
        for i in reversed(range(len(self.own))):
            pre = grad * (1 - acts[i + 1] ** 2)
            self.sums[i] = self.sums[i] + acts[i].T @ pre
            grad = pre @ self.weights[self.own[i]].T
        return loss, None if self.placement.first else grad

    def eval_sums(self, outputs, targets):
        loss = float(0.5 * np.mean(np.sum((outputs - targets) ** 2, axis=1)))
        return loss, {"positive": float(np.sum(outputs > 0))}

    def pack(self, tensor):
        return np.array(tensor)

    def unpack(self, payload, requires_grad):
        return payload

    def gradients(self):
        return self.sums

    def norm(self, tensors):
        return float(np.sqrt(sum(np.sum(t ** 2) for t in tensors)))

    def apply(self, grads, clip_norm, norm):
        coef = 1.0 if clip_norm is None else min(1.0, clip_norm / (norm + 1e-6))
        for b, g in zip(self.own, grads):
            self.weights[b] = self.weights[b] - LR * coef * g

    def discard_gradients(self):
        self.sums = []

    def count_skipped_update(self):
        self.skipped += 1

    def alltoall(self, payload, to_stage, name):
        sent = self._meet(self.placement.replica_set, name, (to_stage, payload))
        got = [p for r, (to, p) in sent.items() if to == self.placement.stage]
        assert len(got) <= 1
        return got[0] if got else None

    def stage_average(self, tensors, name, compress):
        everyone = self._meet(self.placement.stage_set, name, tensors)
        return [np.mean([everyone[r][i] for r in sorted(everyone)], axis=0) for i in range(len(tensors))]

    def allreduce_sum(self, values, name, process_set):
        everyone = self._meet(process_set, name, values)
        return [float(sum(everyone[r][i] for r in sorted(everyone))) for i in range(len(values))]

    def broadcast_object(self, obj, root_rank, name, process_set):
        return self._meet(process_set, name, obj)[root_rank]

    def own_state(self):
        return {"model": {f"w{b}": w.copy() for b, w in self.weights.items()}, "optimizer": {}, "groups": None}

    def load_own_state(self, state):
        self.weights = {b: np.array(state["model"][f"w{b}"]) for b in self.own}

    def broadcast_own_state(self, root_rank):
        self.load_own_state(self._meet(self.placement.stage_set, "bcast", self.own_state())[root_rank])

    def statistics(self):
        return []

    def assign(self, tensors, values):
        raise AssertionError("no statistics to assign")

    def all_finite(self, values):
        return all(np.isfinite(v).all() for v in values)

    def read_checkpoint(self, directory):
        with np.load(Path(directory) / "model.npz") as saved:
            return {"model": {k: saved[k] for k in saved.files}, "optimizer": {}, "groups": None}

    def write_checkpoint(self, directory, state):
        assert sorted(state["model"]) == [f"w{b}" for b in range(BLOCKS)]
        np.savez(Path(directory) / "model.npz", **state["model"])


def config(micro_batches, clip=None, nonfinite="skip"):
    return SimpleNamespace(parallel=SimpleNamespace(micro_batches=micro_batches),
                           optim=SimpleNamespace(grad_clip_norm=clip), train=SimpleNamespace(nonfinite=nonfinite))


def placements(stages, replicas):
    layout = Layout(stages, replicas)
    world = tuple(range(layout.world_size))
    out = []
    for rank in range(layout.world_size):
        stage_set = tuple(layout.stage_ranks(layout.stage_of(rank))) if replicas > 1 else None
        out.append(Placement(layout, rank, stage_set, tuple(layout.replica_ranks(layout.replica_of(rank))), world))
    return out


def run_ranks(stages, replicas, work):
    """``work(rank)`` on every rank at once; the results by rank."""
    with ThreadPoolExecutor(stages * replicas) as pool:
        futures = [pool.submit(work, r) for r in range(stages * replicas)]
        return [f.result(timeout=60) for f in futures]


def initial_weights(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((WIDTH, WIDTH)) * 0.8 for _ in range(BLOCKS)]


def reference_step(weights, x, t, clip):
    """One step of the un-cut model on the replicas' batches (their mean losses averaged)."""
    grads = [np.zeros_like(w) for w in weights]
    losses = []
    for xr, tr in zip(x, t):
        acts = [xr]
        for w in weights:
            acts.append(np.tanh(acts[-1] @ w))
        losses.append(float(0.5 * np.mean(np.sum((acts[-1] - tr) ** 2, axis=1))))
        grad = (acts[-1] - tr) / len(tr)
        for i in reversed(range(len(weights))):
            pre = grad * (1 - acts[i + 1] ** 2)
            grads[i] += acts[i].T @ pre / len(x)
            grad = pre @ weights[i].T
    norm = float(np.sqrt(sum(np.sum(g ** 2) for g in grads)))
    coef = 1.0 if clip is None else min(1.0, clip / (norm + 1e-6))
    return [w - LR * coef * g for w, g in zip(weights, grads)], losses


def batches(replicas, batch, seed=1):
    rng = np.random.default_rng(seed)
    return ([rng.standard_normal((batch, WIDTH)) for _ in range(replicas)],
            [rng.standard_normal((batch, WIDTH)) for _ in range(replicas)])


@pytest.mark.parametrize("stages,replicas,micro,bounds,clip", [
    (2, 2, 2, [2], None), (2, 2, 3, [1], 0.05), (3, 2, 4, [1, 3], None), (4, 1, 2, [1, 2, 3], 0.05),
    (2, 3, 1, [3], None)])
def test_a_step_equals_the_uncut_model(stages, replicas, micro, bounds, clip):
    weights, places = initial_weights(), placements(stages, replicas)
    world = World(stages * replicas)
    x, t = batches(replicas, 5)  # 5 samples: micro-batches of unequal sizes
    drivers = [GPipe(p, config(micro, clip), NumpyStage(world, p, weights, bounds)) for p in places]

    def work(rank):
        place = places[rank]
        return drivers[rank].train_step(x[place.replica], t[place.replica])

    losses = run_ranks(stages, replicas, work)
    expected, ref_losses = reference_step(weights, x, t, clip)
    for rank, driver in enumerate(drivers):
        assert losses[rank] == pytest.approx(ref_losses[places[rank].replica], abs=1e-12)
        for b, w in driver.stage.weights.items():
            np.testing.assert_allclose(w, expected[b], rtol=0, atol=1e-12)
    for replica in range(replicas):  # the ranks of a replica met in the same transfers, in the same order
        ranks = places[0].layout.replica_ranks(replica)
        transfers = [[e for e in world.log[r] if ".fwd." in e[0] or ".bwd." in e[0]] for r in ranks]
        assert all(tr == transfers[0] for tr in transfers)
    ticks = micro + stages - 1
    assert sum(".fwd." in n for n, _ in world.log[0]) == ticks - 1  # the last fill tick: no transfer
    assert sum(".bwd." in n for n, _ in world.log[0]) == ticks - 1  # the last drain tick: no transfer


def test_evaluation_keys_are_the_last_stages_everywhere():
    weights, places = initial_weights(), placements(2, 2)
    world = World(4)
    x, t = batches(2, 4)
    drivers = [GPipe(p, config(2), NumpyStage(world, p, weights, [2])) for p in places]
    sums = run_ranks(2, 2, lambda r: drivers[r].eval_step(x[places[r].replica], t[places[r].replica]))
    assert all(sorted(s) == ["count", "loss_sum", "positive"] for s in sums)
    for rank, s in enumerate(sums):
        if places[rank].last:
            _, ref = reference_step(weights, [x[places[rank].replica]], [t[places[rank].replica]], None)
            assert s["count"] == 4 and s["loss_sum"] == pytest.approx(4 * ref[0])
        else:
            assert set(s.values()) == {0.0}


def test_gather_save_load_broadcast_restores_every_stage(tmp_path):
    places, trained = placements(2, 2), initial_weights(3)
    world = World(4)
    drivers = [GPipe(p, config(2), NumpyStage(world, p, trained, [2])) for p in places]

    def save(rank):
        drivers[rank].gather_state()
        if rank == 0:
            assert drivers[rank].state_is_finite()
            drivers[rank].save_state(tmp_path)

    run_ranks(2, 2, save)
    fresh = [GPipe(p, config(2), NumpyStage(world, p, initial_weights(rank), [2])) for rank, p in enumerate(places)]

    def load(rank):
        if rank == 0:
            fresh[rank].load_state(tmp_path)
        fresh[rank].broadcast_state(0)

    run_ranks(2, 2, load)
    for driver in fresh:
        for b, w in driver.stage.weights.items():
            np.testing.assert_array_equal(w, trained[b])


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_nonfinite_gradient_is_decided_the_same_on_every_rank(policy):
    weights, places = initial_weights(), placements(2, 2)
    world = World(4)
    x, t = batches(2, 4)
    x[1][0, 0] = np.nan  # replica 1's batch only: the stage allreduce spreads it
    drivers = [GPipe(p, config(2, nonfinite=policy), NumpyStage(world, p, weights, [2])) for p in places]

    def work(rank):
        try:
            drivers[rank].train_step(x[places[rank].replica], t[places[rank].replica])
        except NonFiniteGradientError:
            return "raised"
        return "skipped"

    outcomes = run_ranks(2, 2, work)
    assert set(outcomes) == {"raised" if policy == "error" else "skipped"}
    for driver in drivers:
        assert driver.stage.skipped == (1 if policy == "skip" else 0)
        for b, w in driver.stage.weights.items():
            np.testing.assert_array_equal(w, weights[b])


def test_slice_batch_takes_rows_of_a_dict_or_an_array():
    batch = {"ids": np.arange(6).reshape(3, 2), "mask": np.ones((3, 2))}
    assert slice_batch(batch, 1, 3)["ids"].tolist() == [[2, 3], [4, 5]]
    assert slice_batch(np.arange(5), 2, 4).tolist() == [2, 3]


def test_an_adapter_hands_the_pipelined_methods_to_its_pipeline():
    class Base:
        def set_learning_rate(self, lr):
            return ("adapter", lr)

    for name in PIPELINED:  # the adapter's own versions
        setattr(Base, name, lambda self, *args, _name=name: ("adapter", _name, *args))

    @pipelined
    class Adapter(Base):
        def save_state(self, directory):
            return ("adapter", "save_state", directory)

    class Pipeline:
        def __getattr__(self, name):
            return lambda *args, **kwargs: ("pipeline", name, *args)

    adapter = Adapter()
    assert adapter.pipeline is None
    assert adapter.save_state("d") == ("adapter", "save_state", "d")
    assert adapter.gather_state() == ("adapter", "gather_state")  # inherited, wrapped as well
    adapter.pipeline = Pipeline()
    assert adapter.save_state("d") == ("pipeline", "save_state", "d")
    assert adapter.gather_state() == ("pipeline", "gather_state")
    assert adapter.train_step(1, 2) == ("pipeline", "train_step", 1, 2)
    assert adapter.set_learning_rate(0.1) == ("adapter", 0.1)  # not a pipelined method
