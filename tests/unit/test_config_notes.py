"""What the config's loader rewrote (an old key spelling, train.fp16_allreduce's alias) travels on
the config as ``config.notes``; rank 0 prints it once as the run begins. The loader itself prints
nothing and reads no launcher's variables: it runs on every rank before Horovod says which is 0."""

from __future__ import annotations

from types import SimpleNamespace

from hvdtrain.core.resolve import load_config
from hvdtrain.core.visibility import ConfigNotes, run_callbacks

ALIAS = "train.fp16_allreduce=true is the older spelling of comm.compression=fp16; the old key still works"
MOVED = "data.image_size is now image.size (a key of recipe image-classification); the old spelling still works"


def test_the_loader_records_notes_and_prints_none(capsys, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")  # a launcher's rank is not the loader's business
    config = load_config(overrides=["train.fp16_allreduce=true", "data.image_size=32", "data.image_size=48"])
    assert (config.comm.compression, config.image.size) == ("fp16", 48)
    assert sorted(config.notes) == sorted([ALIAS, MOVED])  # each once, however often the old key is given
    assert capsys.readouterr().err == ""
    assert load_config().notes == ()


def test_rank_0_prints_the_notes_once_as_the_run_begins(capsys):
    config = load_config(overrides=["data.image_size=32"])
    main, other = ConfigNotes(config), ConfigNotes(config)
    other.on_train_begin(SimpleNamespace(is_main=False), {})
    assert capsys.readouterr().err == ""
    main.on_train_begin(SimpleNamespace(is_main=True), {})
    main.on_train_begin(SimpleNamespace(is_main=True), {})  # an elastic reset begins again: not twice
    assert capsys.readouterr().err == f"hvdtrain: note: {MOVED}\n"


def test_every_run_carries_the_notes_callback():
    config = load_config(overrides=["data.image_size=32"])
    hooks = run_callbacks(config, SimpleNamespace(), None, None, SimpleNamespace())
    assert [cb.notes for cb in hooks.callbacks if isinstance(cb, ConfigNotes)] == [(MOVED,)]
