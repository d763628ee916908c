"""issue 39, item 2, what needs no job: the position a prepared loop's data keeps
(hvdtrain.core.own_loop.DataPosition through hvdtrain.torch.positioned.PositionedLoader, read as the
DataLoader hands the batches out), and prepare()'s refusals, which come before Horovod starts.
tests/distributed/test_prepare.py runs prepare() itself under horovodrun."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hvdtrain.core import sharding
from hvdtrain.core.config import ConfigError
from hvdtrain.core.own_loop import DataPosition
from hvdtrain.core.resume import Position
from hvdtrain.torch.positioned import PositionedLoader, loader_facts
from envguard import isolate_environ

N, BATCH, SEED = 48, 4, 3
DATASET = TensorDataset(torch.arange(N))


def loader(rank, size, **kwargs):
    return PositionedLoader(DATASET, DataPosition(N, BATCH, rank, size, SEED, **kwargs))


def samples(batches):
    return [int(i) for batch in batches for i in batch[0]]


def test_a_pass_deals_the_epochs_order_to_the_ranks_and_counts_what_was_handed_out():
    ranks = [loader(r, 2) for r in range(2)]
    seen = [samples(iter(r)) for r in ranks]
    order = sharding.epoch_order(N, 0, SEED).tolist()
    assert sorted(seen[0] + seen[1]) == list(range(N)) and seen[0] == order[0::2] and seen[1] == order[1::2]
    assert [r.epoch for r in ranks] == [1, 1] and len(ranks[0]) == N // 2 // BATCH
    assert samples(iter(ranks[0])) == sharding.epoch_order(N, 1, SEED).tolist()[0::2]  # the next epoch reshuffled


@pytest.mark.parametrize("after, size", [(3, 1), (3, 3), (5, 4)])
def test_a_run_stopped_inside_an_epoch_goes_on_at_the_next_sample_at_any_world_size(after, size):
    """Two workers train ``after`` batches each; the position is checkpointed while they train on
    the last of them; ``size`` workers resumed from it see the rest of the epoch's order, each sample once."""
    ranks = [loader(r, 2) for r in range(2)]
    before, iterators = [], [iter(r) for r in ranks]
    for _ in range(after):
        before += [int(i) for it in iterators for i in next(it)[0]]
    position = ranks[0].position.position(step=after)
    assert position == Position(0, after * BATCH * 2, after)
    resumed = [loader(r, size) for r in range(size)]
    rest = []
    for r in resumed:
        r.position.resume_at(position)
        rest += samples(iter(r))
    assert sorted(before + rest) == list(range(N))  # every sample of the epoch exactly once (N divides evenly)
    assert set(rest) == set(sharding.epoch_order(N, 0, SEED)[position.consumed:].tolist())


def test_the_last_batch_handed_out_completes_the_epoch_and_break_continues_where_it_stopped():
    one = loader(0, 1)
    it = iter(one)
    for _ in range(len(one) - 1):
        next(it)
    assert one.position.position(7).epoch == 0
    next(it)  # the last batch: a checkpoint written while training on it is an epoch checkpoint
    assert one.position.position(7) == Position(1, 0, 7)
    stopped = loader(0, 1)
    first = next(iter(stopped))  # a loop that breaks after one batch ...
    order = sharding.epoch_order(N, 0, SEED).tolist()
    assert [int(i) for i in first[0]] == order[:BATCH]
    assert samples(iter(stopped)) == order[BATCH:]  # ... goes on after it at the next iteration
    assert stopped.epoch == 1


def test_drop_last_and_set_epoch():
    dropped = loader(0, 1, drop_last=True)
    dropped.position.batch_size = 5
    assert len(dropped) == N // 5 and all(len(b[0]) == 5 for b in iter(dropped))
    plain = loader(0, 1)
    plain.set_epoch(0)  # the epoch under way: nothing changes
    plain.set_epoch(4)
    assert samples(iter(plain)) == sharding.epoch_order(N, 4, SEED).tolist()


def test_a_dataloader_keeps_its_settings_and_sampling_it_cannot_resume_is_refused():
    dataset, batch, shuffle, drop_last, settings = loader_facts(
        DataLoader(DATASET, batch_size=8, shuffle=True, drop_last=True, collate_fn=list))
    assert (dataset, batch, shuffle, drop_last, settings["collate_fn"]) == (DATASET, 8, True, True, list)
    assert loader_facts(DATASET)[1:3] == (None, None)
    with pytest.raises(ConfigError, match=r"^data: a DataLoader with its own sampler \(.*WeightedRandomSampler"):
        loader_facts(DataLoader(DATASET, batch_size=2, sampler=torch.utils.data.WeightedRandomSampler([1.0] * N, N)))
    with pytest.raises(ConfigError, match=r"^data: .*generator is not a map-style dataset"):
        loader_facts(x for x in range(3))


@pytest.fixture(autouse=True)
def _torch_environment(monkeypatch):
    """torch's first optimizer in a process sets TORCHINDUCTOR_CACHE_DIR itself."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))


def refused(*args, **kwargs):
    """prepare()'s refusal, raised before Horovod starts (in a fresh process: nothing initialised)."""
    from hvdtrain.torch import prepare
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError) as info:
        prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), *args, **kwargs)
    return str(info.value)


def test_a_combination_the_rulebook_refuses_names_both_keys_as_the_cli_does():
    from hvdtrain.core.resolve import load_config
    overrides = ["comm.compression=powersgd", "parallel.shard_optimizer=gradients"]
    with pytest.raises(ConfigError) as cli:
        load_config({}, overrides=overrides)
    message = refused(overrides=overrides)
    assert message == str(cli.value)
    assert "comm.compression=powersgd" in message and "parallel.shard_optimizer=gradients" in message
    assert "\n" not in message
    assert refused(parallel__shard_optimizer="gradients", comm__local_sgd_steps=4).startswith(
        "parallel.shard_optimizer=gradients cannot be combined with comm.local_sgd_steps=4")


def test_trainer_only_keys_and_contradictions_are_refused_by_name():
    assert refused(overrides=["train.compile=default"]).startswith("train.compile='default' is a Trainer-only setting")
    assert refused(train__mixed_precision="bf16").startswith("train.mixed_precision='bf16' is a Trainer-only")
    assert refused(optim__lr=0.5).startswith("optim.lr: your optimizer")
    assert refused(DataLoader(DATASET, batch_size=8), overrides=["train.batch_size=4"]) == \
        "train.batch_size=4 contradicts the DataLoader's batch_size=8; set one of them"
    assert refused(framework="tensorflow").startswith("framework='tensorflow': hvdtrain.torch.prepare runs PyTorch")
    model = torch.nn.Linear(2, 2)
    from hvdtrain.torch import prepare
    with pytest.raises(ConfigError, match=r"^optimizer: builtins.dict is not a torch.optim.Optimizer"):
        prepare(model, {"lr": 0.1})


def test_refusals_come_before_horovod_starts():
    code = ("import horovod.torch as hvd, torch; from hvdtrain.torch import prepare\n"
            "m = torch.nn.Linear(2, 2)\n"
            "try:\n    prepare(m, torch.optim.SGD(m.parameters(), lr=0.1), train__elastic=True)\n"
            "except ValueError as e:\n    print(e)\n"
            "print('initialised' if hvd.is_initialized() else 'not initialised')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.splitlines() == ["train.elastic=True is a Trainer-only setting (the Trainer re-forms the job and "
                                "commits its state); prepare() runs your own loop: leave train.elastic unset, or "
                                "train through hvdtrain.Trainer / a recipe", "not initialised"]
