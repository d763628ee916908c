"""issue 22, item 13: fuzzing what a user types or hands over, in-process (hypothesis).

Targets: the config loader (YAML, TOML and JSON files), ``--set key=value`` parsing, the text
readers of bert-finetune (CSV, TSV, JSON Lines) and the labels CSV of image-classification's flat
validation folder. The property, for every input: either a result, or the project's error for a
user mistake (:class:`~hvdtrain.core.config.ConfigError`, ``TextDataError``, ``DataError``) whose
message is one line naming the file (or the key); never another exception (which the CLI would
print with a traceback, or not catch at all), never a hang (a per-example deadline, and the
test's timeout), never a write (each example's folder holds only its input, unchanged, after).

Reproducible in CI: ``derandomize=True`` (the examples follow from the test's name, not the
clock), no example database written to the checkout, a bounded number of examples per target
(the whole file runs in about 20 s). A reproducer found here is kept as an explicit example.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvdtrain.core import config as config_module
from hvdtrain.core.config import ConfigError, RunConfig
from hvdtrain.core.resolve import load_config
from hvdtrain.data.index import DataError, read_labels_file
from hvdtrain_recipes.bert_finetune.text_data import LabelledTexts, TextDataError, read_labelled_file

pytestmark = pytest.mark.timeout(120)  # no hang: the whole file, with room for a loaded CI machine

FUZZ = settings(max_examples=150, deadline=5000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# the real keys (core and the default recipe's sections), so that examples reach the checks behind them
SECTIONS = {name: sorted(section) for name, section in config_module.to_dict(load_config()).items()
            if isinstance(section, dict)}
DOTTED = sorted(f"{section}.{key}" for section, keys in SECTIONS.items() for key in keys)
TOP = sorted(k for k, v in config_module.to_dict(load_config()).items() if not isinstance(v, dict))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300, max_value=10**320),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["none", "null", "true", "no", "1e400", "0x10", "balanced", "[3]", "3,6", "torch", "adamw",
                     "!!int x", "&a", "*a", "{", "[", ": ", "- x", "\x00", "\u2028", "~"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
keys = st.one_of(st.sampled_from(DOTTED), st.sampled_from(TOP), st.text(max_size=20),
                 st.builds(lambda k, extra: k + extra, st.sampled_from(DOTTED),
                           st.sampled_from([".x", "..", ".", "="])))


def _nested(pairs: list[tuple[str, object]]) -> dict:
    """``section.key`` pairs as the nested mapping of a config file (a clash keeps the later value)."""
    data: dict = {}
    for key, value in pairs:
        node, parts = data, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return data


def _untouched(folder: Path, inputs: dict[str, bytes]) -> None:
    """``folder`` still holds exactly ``inputs`` (name -> bytes): nothing written, nothing changed."""
    found = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert found == inputs, f"files written or changed: {sorted(set(found) ^ set(inputs))}"


def _one_line_naming(exc: Exception, *names: str) -> None:
    message = str(exc)
    assert message and "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    assert any(name in message for name in names), f"{message!r} names none of {names}"


def _load_file(name: str, content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            assert isinstance(load_config(file=path), RunConfig)
        except ConfigError as exc:
            _one_line_naming(exc, str(path), *DOTTED, *TOP, *SECTIONS, "unknown config key")
        _untouched(Path(tmp), {name: content})


@FUZZ
@given(pairs=st.lists(st.tuples(keys, values), max_size=6), suffix=st.sampled_from([".yaml", ".json"]))
@example(pairs=[("optim.lr", 10**400)], suffix=".yaml")  # was OverflowError: int too large to convert to float
@example(pairs=[("parallel.cut", [[1, [2]], 3])], suffix=".yaml")  # a tree in the free-form key
def test_structured_config_files(pairs, suffix):
    text = yaml.safe_dump(_nested(pairs), allow_unicode=True) if pairs else ""
    _load_file("config" + suffix, text.encode("utf-8"))


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8"))),
       suffix=st.sampled_from([".yaml", ".yml", ".json", ".toml", ".cfg", ""]))
@example(content=b"train:\n  epochs: \xff\n", suffix=".yaml")  # was UnicodeDecodeError, naming no file
@example(content=b"train: {epochs: 1\n", suffix=".yaml")  # PyYAML's message spans four lines
@example(content=b"a: !!int x\n", suffix=".yaml")  # was ValueError from the YAML constructor
@example(content=b"[train]\nepochs = " + b"9" * 5000, suffix=".toml")  # was ValueError: too many digits
@example(content=b"a: " + b"[" * 3000, suffix=".yaml")  # was RecursionError
@example(content=b"parallel:\n  cut: [&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                 b"&c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                 b"&e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], "
                 b"&g [*f,*f,*f,*f,*f,*f,*f,*f,*f], &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]]\n",
         suffix=".yaml")  # aliases: 43 million leaves when copied; was a hang in validate's asdict
@example(content=b"train:\n  batch_size: 16\ntrain:\n  epochs: 2\n", suffix=".yaml")  # issue 41: dropped the 1st
@example(content=b'{"train": {"epochs": 2, "epochs": 3}}', suffix=".json")  # issue 41: kept the last
@example(content=b"train:\n  epochs: 010\n  seed: 4294967296\n", suffix=".yaml")  # issue 41: 8, then a late error
def test_raw_config_files(content, suffix):
    _load_file("config" + suffix, content)


@FUZZ
@given(overrides=st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={v}", keys, st.text(max_size=30)),
    st.builds(lambda k, v: f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}", keys, values),
    st.text(max_size=30)), max_size=5))
@example(overrides=["optim.lr=" + "9" * 400])  # was OverflowError
@example(overrides=["train.epochs=!!timestamp 2020-13-45"])  # was ValueError from the YAML constructor
@example(overrides=["train.epochs=" + "9" * 5000])  # was ValueError: too many digits for int()
@example(overrides=["train.epochs=" + "[" * 3000])  # was RecursionError
@example(overrides=["train.epochs=1:30", "train.seed=0123"])  # issue 41: were 90 and 83 (YAML 1.1)
@example(overrides=["log.run_name={a: 1, a: 2}"])  # issue 41: a duplicate key in a --set mapping
def test_set_overrides(overrides):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            assert isinstance(load_config(overrides=overrides), RunConfig)
        except ConfigError as exc:
            _one_line_naming(exc, *DOTTED, *TOP, *SECTIONS, "override", "unknown config key", "recipe")
        _untouched(Path(tmp), {})


@FUZZ
@given(overrides=st.lists(st.builds(lambda k, v: f"{k}={v}", keys, st.text(max_size=20)), max_size=3),
       flags=st.lists(st.sampled_from([["--epochs", "0"], ["--epochs", "x"], ["--batch-size", "-1"], ["--lr", "nan"],
                                       ["--framework", "jax"], ["--max-length", "5"], ["--model", ""]]), max_size=2))
def test_the_command_line(overrides, flags):
    """``hvdtrain recipe image-classification --keys`` (the config resolved, then listed: no
    training) with fuzzed ``--set`` and flags: exit 0, or 2 with one error line; no traceback."""
    from click.testing import CliRunner

    from envguard import restore_environ
    from hvdtrain.cli import main

    argv = ["recipe", "image-classification", "--keys", *sum(flags, []), *sum((["--set", o] for o in overrides), [])]
    before = dict(os.environ)
    try:
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
    finally:
        restore_environ(before)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.exit_code in (0, 2), (result.exit_code, result.stderr)
    if result.exit_code:
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith(("hvdtrain: error: ", "Error: ")), result.stderr


# --- bert-finetune's text readers ---------------------------------------------------------------

cells = st.one_of(st.text(max_size=12), st.sampled_from(["", " ", "nan", "NaN", "1", "1.0", "-0", "\"", "a,b",
                                                        "a\tb", "x\ny", "\r", "\ufeff", "\x00"]))


def _csv(rows: list[list[str]], delimiter: str) -> bytes:
    return "\n".join(delimiter.join(row) for row in rows).encode("utf-8")


text_files = st.one_of(
    st.tuples(st.sampled_from([".csv", ".tsv", ".txt"]),
              st.lists(st.lists(cells, min_size=0, max_size=4), max_size=6).map(
                  lambda rows: [["text", "label"]] + rows)).map(
                      lambda t: (t[0], _csv(t[1], "," if t[0] == ".csv" else "\t"))),
    st.tuples(st.sampled_from([".jsonl", ".ndjson", ".json"]),
              st.lists(st.one_of(st.dictionaries(st.sampled_from(["text", "label", "other"]), values, max_size=3),
                                 values), max_size=5).map(
                  lambda rows: "\n".join(yaml.safe_dump(r, default_flow_style=True, width=10**6).strip()
                                         for r in rows).encode("utf-8"))),
    st.tuples(st.sampled_from([".csv", ".tsv", ".jsonl", ".json", ".xml"]), st.binary(max_size=120)),
)


def _read_text(name: str, content: bytes, bad_rows: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            assert isinstance(read_labelled_file(path, "text", "label", bad_rows=bad_rows), LabelledTexts)
        except TextDataError as exc:
            _one_line_naming(exc, str(path))
        _untouched(Path(tmp), {name: content})


@FUZZ
@given(file=text_files, bad_rows=st.sampled_from(["error", "skip"]))
def test_text_readers(file, bad_rows):
    suffix, content = file
    _read_text("data" + suffix, content, bad_rows)


def test_text_reader_huge_json_number():
    """A fuzz finding (fixed by helper data): a JSON number of more than 4300 digits raised ValueError
    ('Exceeds the limit ... for integer string conversion') out of json.loads."""
    _read_text("data.jsonl", b'{"text": "a", "label": ' + b"9" * 5000 + b"}\n", "error")


# --- image-classification's labels CSV --------------------------------------------------------------

labels_rows = st.lists(st.lists(st.one_of(cells, st.sampled_from(["ImageId", "n01440764 1 2 3 4", "a.JPEG",
                                                                 "../x.png", "/abs/y.png"])),
                                max_size=3), max_size=6)


def _read_labels(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "labels.csv"
        path.write_bytes(content)
        try:
            mapping = read_labels_file(path)
            assert isinstance(mapping, dict) and mapping
            assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in mapping.items())
        except DataError as exc:
            _one_line_naming(exc, str(path))
        _untouched(Path(tmp), {"labels.csv": content})


@FUZZ
@given(content=st.one_of(labels_rows.map(lambda rows: _csv(rows, ",")), st.binary(max_size=120)))
def test_labels_csv(content):
    _read_labels(content)


def test_labels_csv_not_utf8():
    """A fuzz finding (fixed by helper data): a labels CSV that is not UTF-8 raised UnicodeDecodeError,
    naming no file."""
    _read_labels(b"\x80")


# --- issue 41: Slurm's host lists, and the geometry of a tensor in a .pth file ----------------------

@FUZZ
@given(text=st.one_of(st.text(alphabet="n[]-,0123456789x ", max_size=24), st.text(max_size=24)))
@example(text="node[0-99999999]")  # was minutes of expansion and gigabytes
@example(text="node[5-1]")  # was an empty host list, exit 0
@example(text="n[]")  # was a traceback
def test_slurm_node_lists(text):
    from hvdtrain.launch.slurm import MAX_HOSTS, NODE_NAME, SlurmError, hostnames

    try:
        names = hostnames(text, "SLURM_JOB_NODELIST")
        assert 0 < len(names) <= MAX_HOSTS and all(NODE_NAME.fullmatch(name) for name in names)
    except SlurmError as exc:
        _one_line_naming(exc, "SLURM_JOB_NODELIST=")


@FUZZ
@given(stored=st.integers(0, 64), offset=st.integers(-5, 2**64), size=st.lists(st.integers(-2, 2**40), max_size=4),
       stride=st.lists(st.integers(-2, 2**40), max_size=4))
@example(stored=4, offset=0, size=[200_000], stride=[1])  # was 38,597 non-zero floats of process memory
def test_torch_pickle_tensor_geometry(stored, offset, size, stride):
    import numpy as np

    from hvdtrain_recipes.image_classification.torch_pickle import NotWeightsError, _rebuild_tensor

    storage = np.arange(1, stored + 1, dtype=np.float32)
    try:
        tensor = _rebuild_tensor(storage, offset, tuple(size), tuple(stride))
    except NotWeightsError as exc:
        assert "\n" not in str(exc)
        return
    assert tensor.shape == tuple(size) and set(tensor.ravel().tolist()) <= set(storage.tolist())
