"""issue 39, item 2, what needs no job: the position a prepared loop's data keeps
(hvdtrain.core.own_loop.DataPosition through hvdtrain.torch.positioned.PositionedLoader, read as the
DataLoader hands the batches out), and prepare()'s refusals, which come before Horovod starts.
tests/distributed/test_prepare.py runs prepare() itself under horovodrun.

issue 61 (own scripts): a peeked ``next(iter(run.data))`` loses no batch; a pass that continues a
checkpoint draws nothing from the global random stream (a plain DataLoader's iterator draws its
seed there); one process through prepare() (tests/unit/own_loop_script.py, no launcher): a checkpoint
of another model, a position past the data, an optimizer setting changed; issue 63, items 3 and 4:
``run.load(checkpoint)`` writes nothing outside, the manifest records the data."""

import json
import subprocess
import sys

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
        for r in ranks:
            r.position.count()  # what optimizer.step() does: the batches handed out are consumed
    position = ranks[0].position.position(step=after)
    assert position == Position(0, after * BATCH * 2, after)
    resumed = [loader(r, size) for r in range(size)]
    rest = []
    for r in resumed:
        r.position.resume_at(position)
        rest += samples(iter(r))
    assert sorted(before + rest) == list(range(N))  # every sample of the epoch exactly once (N divides evenly)
    assert set(rest) == set(sharding.epoch_order(N, 0, SEED)[position.consumed:].tolist())


def test_the_last_batch_stepped_completes_the_epoch_and_break_continues_where_it_stopped():
    one = loader(0, 1)
    it = iter(one)
    for _ in range(len(one) - 1):
        next(it)
    one.position.count()
    assert one.position.position(7).epoch == 0
    next(it)
    one.position.count()  # the update on the last batch: a checkpoint written after it is an epoch checkpoint
    assert one.position.position(7) == Position(1, 0, 7)
    stopped = loader(0, 1)
    first = next(iter(stopped))  # a loop that trains one batch (an update) and breaks ...
    stopped.position.count()
    order = sharding.epoch_order(N, 0, SEED).tolist()
    assert [int(i) for i in first[0]] == order[:BATCH]
    assert samples(iter(stopped)) == order[BATCH:]  # ... goes on after it at the next iteration
    assert stopped.epoch == 1


def test_a_peeked_batch_is_not_lost_and_only_the_newest_pass_hands_out_batches():
    """issue 61, item 3: the DDP tutorial's ``b_sz = len(next(iter(train_data))[0])`` then a ``for``
    loop: every batch of the epoch is trained (before: the peeked one was consumed, 11 of 12 trained)."""
    peeked = loader(0, 1)
    size = len(next(iter(peeked))[0])
    order = sharding.epoch_order(N, 0, SEED).tolist()
    assert size == BATCH and samples(iter(peeked)) == order and peeked.epoch == 1
    old = iter(peeked)
    next(old)
    new = iter(peeked)  # a newer pass: the older iterator hands out nothing more
    assert list(old) == [] and samples(new) == sharding.epoch_order(N, 1, SEED).tolist()


def draws(loader_, resumed_at=None):
    """How many numbers a pass of ``loader_`` draws from torch's global generator (started at
    ``resumed_at``, a checkpoint's position): 0, 1 (what a plain DataLoader's iterator draws), else None."""
    if resumed_at is not None:
        loader_.position.resume_at(resumed_at)
    torch.manual_seed(11)
    start = torch.get_rng_state()
    list(iter(loader_))
    after = torch.get_rng_state()
    torch.set_rng_state(start)
    if torch.equal(after, start):
        return 0
    torch.empty((), dtype=torch.int64).random_()
    return 1 if torch.equal(after, torch.get_rng_state()) else None


def test_a_pass_that_continues_a_checkpoint_draws_nothing_from_the_global_random_stream():
    """issue 61, item 1: a DataLoader's iterator draws its seed from torch's global generator when
    ``iter()`` is called; the run that wrote a checkpoint inside an epoch drew it before the random
    state the checkpoint holds, so the resumed pass must not draw it again (before: it did, and every
    later dropout mask was shifted by one number)."""
    assert draws(loader(0, 1)) == 1  # as a plain DataLoader: the same global stream as an unprepared script
    assert draws(loader(0, 2), Position(0, 2 * BATCH * 2, 2)) == 0  # continuing a checkpoint inside the epoch
    assert draws(loader(0, 1), Position(1, 0, 12)) == 1  # at an epoch's start: the epoch's own draw


def test_drop_last_and_set_epoch():
    dropped = loader(0, 1, drop_last=True)
    dropped.position.batch_size = 5
    assert len(dropped) == N // 5 and all(len(b[0]) == 5 for b in iter(dropped))
    plain = loader(0, 1)
    plain.set_epoch(0)  # the epoch under way: nothing changes
    plain.set_epoch(4)
    assert samples(iter(plain)) == sharding.epoch_order(N, 4, SEED).tolist()


def test_the_manifests_data_facts_read_every_dtype_bfloat16_included():
    """A TensorDataset of bfloat16 tensors (which NumPy cannot hold) is fingerprinted by its bytes."""
    halves = TensorDataset(torch.arange(N * 2, dtype=torch.float32).reshape(N, 2).to(torch.bfloat16),
                           torch.arange(N))
    facts = PositionedLoader(halves, DataPosition(N, BATCH, 0, 1, SEED)).facts()
    assert facts["fingerprint"]["tensors"] == [[[N, 2], "torch.bfloat16"], [[N], "torch.int64"]]
    other = TensorDataset(halves.tensors[0] + 1, halves.tensors[1])
    assert PositionedLoader(other, DataPosition(N, BATCH, 0, 1, SEED)).facts()["fingerprint"]["crc32"] != \
        facts["fingerprint"]["crc32"]


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


def test_one_process_load_refusals_warnings_and_what_it_writes(tmp_path):
    """issue 63, item 3: ``run.load(checkpoint folder)`` left a ``metrics.jsonl`` two levels above it
    cut from 5 rows to 1 (and created one where there was none): now nothing outside is written.
    Issue 63, item 4: the manifest records the data's length and fingerprint; a position past this
    data is refused naming the checkpoint, its position and the data (before: True, and the epoch's
    rest silently skipped). Issue 61, item 7: a checkpoint of another model is one line naming the
    keys (before: torch's multi-line RuntimeError). Issue 61, item 8: another optimizer setting is a
    warning naming it (before: silence); an epoch checkpoint written without metrics resumes without
    "metrics.jsonl had no row for epoch 1"."""
    from jobs import BIN, REPO, run as job

    report = tmp_path / "report.json"
    proc = job([BIN / "python", REPO / "tests" / "unit" / "own_loop_script.py", tmp_path, report], timeout=300)
    seen = json.loads(report.read_text())
    rows = "".join(json.dumps({"epoch": e, "step": 5 * e}) + "\n" for e in range(1, 6))
    assert (tmp_path / "other" / "holder" / "metrics.jsonl").read_text() == rows  # byte for byte
    assert not (tmp_path / "bare" / "holder" / "metrics.jsonl").exists()
    assert seen["outside-other"] is True and seen["outside-other-position"] == [0, 24, 3]
    facts = seen["manifests"]["step-00000003"]
    assert facts["samples"] == 40 and facts["type"] == "torch.utils.data.dataset.TensorDataset"
    assert facts["fingerprint"]["tensors"] == [[[40, 6], "torch.float32"], [[40], "torch.int64"]]
    step = tmp_path / "run" / "checkpoints" / "step-00000003"
    assert seen["past"] == (f"TrainingError: cannot resume: checkpoint {step} is 24 samples into epoch 1 (written "
                            f"on 40 samples), past the end of this data: 8 samples, an epoch of 8 at 1 workers; load "
                            f"it with the data it was trained on (nothing was changed)")
    epoch = tmp_path / "run" / "checkpoints" / "epoch-0001"
    assert seen["model"].startswith(f"TrainingError: cannot resume: checkpoint {epoch} holds another model (other "
                                    f"shapes: 0.weight (8, 6) there, (5, 6) here") and "\n" not in seen["model"]
    assert seen["lr"] is True and seen["resumed"] == [True, 1]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("hvdtrain: warning:")]
    assert warnings == [f"hvdtrain: warning: your optimizer's weight_decay=0.01 (the checkpoint's: 0.0) differs "
                        f"from checkpoint {epoch}; the checkpoint's value runs (load_state_dict restores it): set it "
                        f"after run.load to change it"]
    assert "had no row" not in proc.stderr + proc.stdout
    # issue 61, item 8: the resume line counts epochs as run.epoch does (before: "at epoch 2" with run.epoch 1)
    assert f"hvdtrain: resuming from {epoch} at epoch 1 (run.epoch), at its start, update 5" in proc.stdout
    held = tmp_path / "other" / "holder" / "checkpoints" / "step-00000003"
    assert f"hvdtrain: resuming from {held} at epoch 0 (run.epoch), 24 samples into it, update 3" in proc.stdout
    assert seen["again"] == ("ConfigError: optimizer: prepare() was given the run.optimizer an earlier prepare() "
                             "returned; call prepare() once, with your own model, optimizer and data, and use what it "
                             "returns")


@pytest.mark.parametrize("rank", ["0", "1"])
def test_an_uncaught_refusal_is_one_line_on_rank_0_and_a_non_zero_exit(tmp_path, rank):
    """issue 61, item 7: prepare()'s refusal in a script that does not catch it was a traceback on
    every rank; now rank 0 prints the command line's one line, the other ranks nothing, every rank
    exits 2 (a bad value), as ``hvdtrain recipe`` does. (The rank before Horovod starts is the
    launcher's: ``HOROVOD_RANK``, as ``horovodrun`` sets it.)"""
    from jobs import BIN, run as job

    script = tmp_path / "script.py"
    script.write_text("import torch\nfrom torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler\n"
                      "from hvdtrain.torch import prepare\n"
                      "model = torch.nn.Linear(2, 2)\n"
                      "data = TensorDataset(torch.zeros(8, 2))\n"
                      "prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),\n"
                      "        DataLoader(data, batch_size=2, sampler=WeightedRandomSampler([1.0] * 8, 8)))\n")
    proc = job([BIN / "python", script], timeout=120, check=False, env={"HOROVOD_RANK": rank})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "oneDNN" not in line and "I0000" not in line]
    expected = ["hvdtrain: error: data: a DataLoader with its own sampler (torch.utils.data.sampler."
                "WeightedRandomSampler) has no position to resume at; pass a map-style Dataset, or a "
                "DataLoader(dataset, batch_size=N, shuffle=True|False)"]
    assert lines == (expected if rank == "0" else [])


def test_ctrl_c_in_a_loop_prepared_with_save_on_signal_saves_names_sigint_and_resumes(tmp_path):
    """issue 61, item 8: Ctrl-C in a prepare() loop ended it (KeyboardInterrupt) with no checkpoint,
    where the command line stops at one. With ``prepare(..., save_on_signal=OUTPUT)`` the SIGINT is
    recorded and named as SIGINT, the update under way finishes, the next ``optimizer.step()``
    saves a step checkpoint and the process exits 75; ``run.load(OUTPUT)`` continues from it and
    the run ends. (One process, no launcher: tests/unit/own_loop_script.py's ``signal`` mode.)"""
    from jobs import BIN, REPO, run as job

    script, out, report = REPO / "tests" / "unit" / "own_loop_script.py", tmp_path / "run", tmp_path / "weights.json"
    stopped = job([BIN / "python", script, "signal", out, report], timeout=300, check=False)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    step = out / "checkpoints" / "step-00000003"  # the signal came after update 2: update 3 finished, then saved
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [step.name]
    assert "hvdtrain: rank 0: SIGINT received" in stopped.stderr and "SIGTERM" not in stopped.stderr + stopped.stdout
    assert (f"hvdtrain: SIGINT received: stopped every rank after optimizer step 3 (epoch 1); saved step "
            f"checkpoint {step}; run.load('{out}') continues from there (exit 75)") in stopped.stdout
    assert "Traceback" not in stopped.stderr and not report.exists()

    resumed = job([BIN / "python", script, "signal", out, report], timeout=300)
    assert f"hvdtrain: resuming from {step} at epoch 0 (run.epoch), 24 samples into it, update 3" in resumed.stdout
    assert report.is_file()  # the loop ran its 2 epochs to the end
