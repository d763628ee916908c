"""Bad input gets a clear error naming it, a non-zero exit, and nothing written over (issue 22, item 13).

The corpus is one table, :data:`CASES`: each case builds a bad input (a file, a tree, a config, an
output folder) under ``tmp/in`` and ``tmp/out`` and gives the ``hvdtrain`` command that meets it
and the text the error must contain. :func:`test_bad_input` runs every case the same way and
asserts:

* a non-zero exit (2 for a bad config key, value or name; 1 for bad data or a refused start);
* stderr's last line is the error and names the file, key or host (``needles``);
* no traceback: a user's mistake is one line, not a crash;
* nothing written: the input tree and the output folder hold the same paths and bytes as before
  (a fresh output folder is still absent).

The cases run in-process (``hvdtrain.cli.main`` under click's runner: the real command, its real
error handling and exit code, and for training cases the real Trainer on the torch adapter in a
one-process Horovod job), so a case costs a fraction of a second, not the 5-10 s of a new
``hvdtrain`` process; :data:`IN_A_PROCESS` repeats two of them as real processes, where the exit
path itself (Horovod's shutdown after the error line) matters. To add a case: a function that
makes the bad input and returns the command, and a row in :data:`CASES`.

(The fuzz tests of the same readers are in tests/unit/test_fuzz_inputs.py.)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from envguard import restore_environ
from jobs import horovodrun, hvdtrain_cli, run

from hvdtrain.cli import main


def image_tree(root, classes=("a", "b"), per_class=12, splits=("train", "val")):
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
                    root / split / cls / f"{i}.png")
    return root


def recipe(data, out, *extra):
    return ["recipe", "image-classification", "--data", str(data), "--output", str(out), "--epochs", "1",
            "--batch-size", "4", "--set", "train.log_every=0", "--set", "train.progress_bar=false", *extra]


# --- the cases: each makes its bad input under `inp` (and `out` if it needs one) and returns the command ---

def config_file(name: str, content: bytes) -> Callable[[Path, Path], list[str]]:
    def make(inp, out):
        (inp / name).write_bytes(content)
        return recipe(image_tree(inp / "data"), out, "--config", str(inp / name))
    return make


def flag(*args: str) -> Callable[[Path, Path], list[str]]:
    return lambda inp, out: recipe(image_tree(inp / "data"), out, *args)


def damaged_tree(damage: Callable[[Path], object], *args: str) -> Callable[[Path, Path], list[str]]:
    def make(inp, out):
        data = image_tree(inp / "data")
        damage(data)
        return recipe(data, out, *args)
    return make


def corrupt_jpeg(data: Path) -> None:
    """A JPEG whose header is fine (so the index and the header sample accept it) but whose image
    data ends after 200 bytes: found when decoded."""
    whole = data / "whole.jpg"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(whole, quality=95)
    (data / "train" / "a" / "broken.jpg").write_bytes(whole.read_bytes()[:200])
    whole.unlink()


def decompression_bomb(data: Path) -> None:
    """A PNG whose header claims 30000 x 30000 pixels (Pillow refuses it as a decompression bomb
    when it is opened; the file itself is 60 bytes)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))
    for p in (data / "train" / "a").iterdir():
        p.unlink()
    (data / "train" / "a" / "0.png").write_bytes(png)


def flat_val(labels: bytes | None, images=("v0.png", "v1.png")) -> Callable[[Path, Path], list[str]]:
    """A training tree and a flat validation folder with a labels CSV (ImageNet's layout)."""
    def make(inp, out):
        data = image_tree(inp / "data", splits=("train",))
        (data / "val").mkdir()
        for name in images:
            Image.fromarray(np.zeros((8, 8), dtype=np.uint8), mode="L").save(data / "val" / name)
        if labels is not None:
            (inp / "labels.csv").write_bytes(labels)
        return recipe(data, out, "--set", f"image.val_labels={inp / 'labels.csv'}")
    return make


def hosts(spec: str) -> Callable[[Path, Path], list[str]]:
    return lambda inp, out: ["env", "--hosts", spec.replace("INP", str(inp))]


def slurm_hosts(variables: dict[str, str]) -> Callable[[Path, Path], list[str]]:
    """``hvdtrain slurm-hosts`` inside an allocation whose variables are ``variables``."""
    return lambda inp, out: [{"SLURM_TASKS_PER_NODE": "1", **variables}, "slurm-hosts"]


def earlier_run(change: Callable[[Path], object] = lambda out: None, *args: str) -> Callable[[Path, Path], list[str]]:
    """``out`` holds a finished one-epoch run (its checkpoint, metrics, config; copied from
    :func:`finished_run`), changed by ``change``; then the command of that run (its data, only
    read) again with ``args``."""
    def make(inp, out):
        shutil.copytree(FINISHED["out"], out)
        change(out)
        return recipe(FINISHED["data"], out, *args)  # the same data.path (another one is refused on resume)
    make.needs_finished_run = True
    return make


def run_folder(files: dict[str, bytes]) -> Callable[[Path, Path], list[str]]:
    """``hvdtrain report OUT`` on a run folder holding ``files``."""
    def make(inp, out):
        out.mkdir()
        for name, content in files.items():
            (out / name).write_bytes(content)
        return ["report", str(out)]
    return make


def only_checkpoint(out: Path) -> Path:
    (checkpoint,) = [p for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")]
    return checkpoint


def edit_manifest(edit: Callable[[dict], dict | str]) -> Callable[[Path], None]:
    def change(out):
        manifest = only_checkpoint(out) / "manifest.json"
        edited = edit(json.loads(manifest.read_text()))
        manifest.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    return change


def manifest_escaping(manifest: dict) -> dict:
    files = manifest["files"]
    files["../../in/data/train/a/0.png"] = files.pop(next(iter(files)))
    return manifest


def truncate_weights_listing_nothing(out: Path) -> None:
    checkpoint = only_checkpoint(out)
    edit_manifest(lambda m: {**m, "files": {}})(out)
    for p in checkpoint.iterdir():
        if p.suffix in (".pt", ".npz", ".keras", ".h5") or p.name.startswith("model"):
            p.write_bytes(p.read_bytes()[:64])


def text_file(name: str, content: bytes, *args: str) -> Callable[[Path, Path], list[str]]:
    """bert-finetune on the data file ``name``: a model folder with a real (tiny) tokenizer, whose
    weights file is a stand-in: the data is read, and refused, before the weights are loaded."""
    def make(inp, out):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed" / "workers"))
        try:
            from bert_tiny_model import train_tokenizer
        finally:
            sys.path.pop(0)
        model = inp / "model"
        model.mkdir()
        vocab = train_tokenizer(["a fine film", "a dull film", "truly great", "truly bad"], model / "tokenizer.json",
                                vocab_size=60)
        (model / "config.json").write_text(json.dumps({
            "model_type": "bert", "vocab_size": vocab, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 1, "intermediate_size": 8, "max_position_embeddings": 512}))
        (model / "model.safetensors").write_bytes(b"")
        (inp / name).write_bytes(content)
        return ["recipe", "bert-finetune", "--model", str(model), "--data", str(inp / name), "--output", str(out),
                "--text-column", "text", "--label-column", "label", "--epochs", "1", "--batch-size", "4",
                "--set", "train.log_every=0", "--set", "train.progress_bar=false", *args]
    return make


def into(make: Callable[[Path, Path], list[str]], where: str) -> Callable[[Path, Path], list[str]]:
    """``make``'s command with ``--output inp/where`` (an output inside the input tree)."""
    def make_into(inp, out):
        argv = make(inp, out)
        argv[argv.index("--output") + 1] = str(inp / where)
        return argv
    return make_into


def replace_in_checkpoint(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    """Replace checkpoint file ``name`` by ``content(old bytes)`` and record its SHA-256 in the
    manifest, as someone who hands over a crafted checkpoint would (the damage check passes)."""
    def change(out):
        import hashlib

        checkpoint = only_checkpoint(out)
        path = checkpoint / name
        path.write_bytes(content(path.read_bytes()))
        edit_manifest(lambda m: {**m, "files": {**m["files"], name: hashlib.sha256(path.read_bytes()).hexdigest()}})(out)
    return change


class RunsCode:
    """Pickled (protocol 2, torch.save's), it calls ``os.system``: what a crafted weights file holds."""

    def __reduce__(self):
        return os.system, ("touch /tmp/hvdtrain-bad-input-ran",)


def rank_state_wrong_size(old: bytes) -> bytes:
    states = json.loads(old)
    states[0]["rng"]["python"][1] = [1, 2, 3]
    return json.dumps(states).encode()


def predict_export(files: dict[str, bytes]) -> Callable[[Path, Path], list[str]]:
    """``hvdtrain predict`` of an export folder ``inp/run/model`` holding ``files`` (an image
    export record of a tiny torch model unless ``files`` replaces it) on one PNG."""
    def make(inp, out):
        model = inp / "run" / "model"
        model.mkdir(parents=True)
        record = {"labels": ["a", "b"], "label2id": {"a": 0, "b": 1}, "framework": "torch", "source": "hvdtrain",
                  "model": "small_cnn", "size": 8, "transform": "resize", "val_crop": 0.875, "channels": 1,
                  "grayscale": True, "mean": [0.5], "std": [0.5]}
        for name, content in {"image_model.json": json.dumps(record).encode(), **files}.items():
            (model / name).write_bytes(content)
        Image.fromarray(np.zeros((8, 8), dtype=np.uint8), mode="L").save(inp / "x.png")
        (inp / "run" / "config.yaml").write_text("recipe: image-classification\n")
        return ["predict", str(inp / "run"), str(inp / "x.png")]
    return make


def keras_os_system() -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        archive.writestr("config.json", json.dumps({"module": "os", "class_name": "system",
                                                    "registered_name": "system", "config": {"command": "true"}}))
    return buffer.getvalue()


def unfinished_conversion(inp, out):
    """The shards of ``hvdtrain convert`` killed after its first shard (``.hvdtrain-convert/``, no manifest)."""
    from hvdtrain.data.convert import convert

    class Killed(Exception):
        pass

    def kill(entry):
        raise Killed

    try:
        convert(image_tree(inp / "src"), inp / "shards", "webdataset", samples_per_shard=4, cache=inp / "cache",
                progress=kill)
    except Killed:
        pass
    return recipe(inp / "shards", out)


TEXT_ROWS = b"text,label\n" + b"a fine film,pos\na dull film,neg\n" * 10


@dataclass(frozen=True)
class Case:
    make: Callable[[Path, Path], list[str]]
    needles: tuple[str, ...]  # all of them in stderr's last line
    exit: int = 1


NOT_YET = "output folder changed by a run that failed: "  # the reason of a case that fails today, for its owner

CASES = {
    # the config: unknown keys, wrong types, bad values, the file itself (exit 2)
    "unknown key (--set)": Case(flag("--set", "train.epochz=2"), ("unknown config key train.epochz", "epochs"), 2),
    "unknown key (file)": Case(config_file("c.yaml", b"train:\n  epoch: 2\n"), ("unknown config key train.epoch",), 2),
    "unknown section (file)": Case(config_file("c.yaml", b"text:\n  max_length: 8\n"),
                                   ("unknown config key text", "bert-finetune"), 2),
    "wrong type (--set)": Case(flag("--set", "train.batch_size=four"), ("train.batch_size: expected an integer",), 2),
    "wrong type (file)": Case(config_file("c.yaml", b"optim:\n  lr: fast\n"), ("optim.lr: expected a number",), 2),
    "wrong type (toml)": Case(config_file("c.toml", b"[data]\nshuffle = 3\n"), ("data.shuffle: expected true",), 2),
    "number beyond float": Case(flag("--set", "optim.lr=" + "9" * 400), ("optim.lr: expected a number",), 2),
    "section given a value": Case(flag("--set", "train=3"), ("train: expected a mapping",), 2),
    "bad choice": Case(flag("--set", "optim.decay=step"), ("'step'", "cosine, linear, constant"), 2),
    "bad choice (nonfinite)": Case(flag("--set", "train.nonfinite=ignore"), ("choose one of: error, skip",), 2),
    "bad choice (bad_files)": Case(flag("--set", "data.bad_files=maybe"), ("choose one of: error, skip",), 2),
    "out of range": Case(flag("--batch-size", "0"), ("train.batch_size: 0 is out of range",), 2),
    "out of range (every_steps)": Case(flag("--set", "checkpoint.every_steps=-1"), ("checkpoint.every_steps",), 2),
    "not finite": Case(flag("--set", "optim.lr=.nan"), ("optim.lr: nan is not a finite number",), 2),
    "--set without =": Case(flag("--set", "novalue"), ("'novalue' must look like section.key=value",), 2),
    "config file missing": Case(lambda inp, out: recipe(image_tree(inp / "d"), out, "--config", str(inp / "no.yaml")),
                                ("no.yaml", "does not exist"), 2),
    "config file syntax": Case(config_file("c.yaml", b"train: {epochs: 1\n"), ("c.yaml: line 2",), 2),
    "config file not UTF-8": Case(config_file("c.yaml", b"train:\n  epochs: \xff\n"), ("c.yaml is not UTF-8",), 2),
    "config file not a mapping": Case(config_file("c.yaml", b"- 1\n"), ("c.yaml", "mapping"), 2),
    "config file extension": Case(config_file("c.cfg", b"x"), ("c.cfg", "unknown extension"), 2),
    "config file aliases": Case(config_file("c.yaml", b"parallel:\n  cut: [&a [1,1,1,1], &b [*a,*a,*a,*a]]\n"),
                                ("parallel.cut",), 2),
    "config file: a section twice (issue 41, item 7)": Case(
        config_file("c.yaml", b"train:\n  batch_size: 16\nlog:\n  log_dir: x\ntrain:\n  epochs: 1\n"),
        ("c.yaml", "line 5", "duplicate key 'train'"), 2),
    "config file: a JSON key twice (issue 41, item 7)": Case(
        config_file("c.json", b'{"train": {"epochs": 1, "epochs": 2}}'), ("c.json", "duplicate key 'epochs'"), 2),
    "sexagesimal epochs (issue 41, item 7)": Case(flag("--set", "train.epochs=1:30"),
                                                  ("train.epochs: expected an integer, got '1:30'",), 2),
    "seed beyond NumPy's (issue 41, item 7)": Case(flag("--set", "train.seed=4294967296"),
                                                   ("train.seed: 4294967296 is out of range",), 2),
    "unknown recipe": Case(lambda inp, out: ["recipe", "no-such-recipe", "--output", str(out)],
                           ("unknown recipe 'no-such-recipe'", "image-classification"), 2),
    "unknown framework": Case(flag("--framework", "jax"), ("'jax' is not one of", "torch", "tensorflow"), 2),
    "recipe file missing": Case(lambda inp, out: ["recipe", str(inp / "mine.py"), "--output", str(out)],
                                ("mine.py",), 2),
    # the data (exit 1)
    "--data URL with a password (issue 41, item 4)": Case(
        lambda inp, out: recipe("http://alice:s3cr3t-Pa55@127.0.0.1:9/shards/", out), ("http://***@127.0.0.1:9/shards",)),
    "data folder missing": Case(lambda inp, out: recipe(inp / "nope", out), (str(Path("in") / "nope"),)),
    "empty class folder": Case(damaged_tree(lambda d: [p.unlink() for p in (d / "train" / "b").iterdir()]),
                               ("holds no images", str(Path("train") / "b"))),
    "class folders differ": Case(damaged_tree(lambda d: (d / "val" / "b").rename(d / "val" / "c")),
                                 ("class folders differ",)),
    "empty validation split": Case(damaged_tree(lambda d: [p.unlink() for p in (d / "val").rglob("*.png")]),
                                   ("holds no images", "val")),
    "labels CSV missing": Case(flat_val(None), ("labels file", "labels.csv", "does not exist")),
    "labels CSV without a row": Case(flat_val(b"file,class\nv0.png,a\n"), ("v1.png", "labels.csv")),
    "labels CSV unknown class": Case(flat_val(b"file,class\nv0.png,a\nv1.png,zebra\n"), ("labels.csv", "'zebra'")),
    "labels CSV empty": Case(flat_val(b"file,class\n"), ("labels.csv", "no rows")),
    "decompression bomb (item 8)": Case(damaged_tree(decompression_bomb), (str(Path("train") / "a" / "0.png"),)),
    "corrupt JPEG": Case(damaged_tree(corrupt_jpeg), ("broken.jpg", "image.bad_files=skip")),
    "text: unquoted comma (item 9)": Case(text_file("d.csv", TEXT_ROWS + b"truly, truly great,pos\n"),
                                          ("d.csv line 22", "more fields than the header")),
    "text: no line breaks (item 9)": Case(text_file("d.tsv", b"text\tlabel\r" + b"a fine film\tpos\r" * 1_100_000),
                                          ("d.tsv line 1", "is longer than")),
    "text: column missing": Case(text_file("d.jsonl", b'{"sentence": "a fine film", "label": "pos"}\n'),
                                 ("d.jsonl", "no column 'text'", "sentence")),
    "bert: --output holding the --model folder (item 5)": Case(
        into(text_file("d.csv", TEXT_ROWS), "."), ("is the model this run starts from", "choose another --output")),
    "text: not UTF-8": Case(text_file("d.csv", TEXT_ROWS + b"caf\xe9,pos\n"), ("d.csv line 22", "not UTF-8")),
    "image: an unfinished hvdtrain convert (issue 41, item 3)": Case(
        unfinished_conversion, ("holds an unfinished hvdtrain convert", "run the same hvdtrain convert")),
    # the other commands
    "predict: image_model.json size 100000 (issue 41, item 5)": Case(
        predict_export({"image_model.json": json.dumps({"labels": ["a"], "framework": "torch", "size": 100000}).encode()}),
        ("image_model.json: 'size' is '100000'", "8-4096")),
    "predict: a Keras export naming os.system (issue 41, item 8)": Case(
        predict_export({"image_model.json": json.dumps({
            "labels": ["a", "b"], "framework": "tensorflow", "source": "hvdtrain", "model": "small_cnn", "size": 8,
            "transform": "resize", "val_crop": 0.875, "channels": 1, "grayscale": True, "mean": [0.5],
            "std": [0.5]}).encode(), "model.keras": keras_os_system()}),
        ("model.keras is not a Keras model hvdtrain can load",)),
    "predict: an export whose config.json has an auto_map (issue 41, item 1)": Case(
        predict_export({"image_model.json": json.dumps({
            "labels": ["a", "b"], "framework": "torch", "source": "huggingface", "model": "vit", "size": 8,
            "transform": "resize", "val_crop": 0.875, "channels": 3, "grayscale": False, "mean": [0.5] * 3,
            "std": [0.5] * 3}).encode(),
            "config.json": json.dumps({"model_type": "vit", "auto_map": {"AutoConfig": "evil.EvilConfig"}}).encode(),
            "evil.py": b"import os\nos.system('touch /tmp/hvdtrain-bad-input-ran')\n"}),
        ("asks to run its own code", "auto_map")),
    "predict without an export": Case(lambda inp, out: ["predict", str(inp), "a fine film"],
                                      ("holds no exported text model",)),
    "report: no metrics": Case(run_folder({}), ("has no metrics.jsonl",)),
    "report: torn metrics line": Case(run_folder({"metrics.jsonl": b'{"epoch": 1}\n{"epo'}),
                                      ("metrics.jsonl:2 is not valid JSON",)),
    "report: metrics not UTF-8": Case(run_folder({"metrics.jsonl": b'{"epoch": 1}\n\xff\n'}),
                                      ("metrics.jsonl",)),
    "report: metrics line not an object": Case(run_folder({"metrics.jsonl": b'{"epoch": 1}\n[1, 2]\n'}),
                                               ("metrics.jsonl:2",)),
    # hosts (item 4)
    "host name is an ssh option (item 4)": Case(hosts("-oProxyCommand=touch INP/marker:1"),
                                                ("-oProxyCommand=touch", "is not a host name")),
    # hostile Slurm variables (issue 41, item 6)
    "Slurm: node list of 100 million hosts (issue 41, item 6)": Case(
        slurm_hosts({"SLURM_JOB_NODELIST": "node[0-99999999]"}), ("SLURM_JOB_NODELIST=", "more than 200,000 hosts")),
    "Slurm: descending node range (issue 41, item 6)": Case(
        slurm_hosts({"SLURM_JOB_NODELIST": "node[5-1]"}), ("SLURM_JOB_NODELIST='node[5-1]'", "descends")),
    "Slurm: tasks per node x 99999999999 (issue 41, item 6)": Case(
        slurm_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "1(x99999999999)"}),
        ("SLURM_TASKS_PER_NODE='1(x99999999999)'",)),
    # an output folder of an earlier run (items 4, 5, 7)
    "used output without --resume (item 5)": Case(earlier_run(), ("--resume", "metrics.jsonl")),
    "resume with another seed (item 7)": Case(earlier_run(lambda out: None, "--resume", "--set", "train.seed=7"),
                                              ("train.seed",)),
    "resume with another shuffle (item 7)": Case(
        earlier_run(lambda out: None, "--resume", "--set", "data.shuffle=false"), ("data.shuffle",)),
    "resume with another remainder (item 7)": Case(
        earlier_run(lambda out: None, "--resume", "--set", "data.remainder=drop"), ("data.remainder",)),
    "resume: model.pt with pickled code (issue 41, item 8)": Case(
        earlier_run(replace_in_checkpoint("model.pt", lambda old: pickle.dumps(RunsCode(), protocol=2)), "--resume"),
        ("model.pt holds pickled objects besides tensors", "GLOBAL posix.system")),
    "resume: rank_state.json of the wrong size (issue 41, item 8)": Case(
        earlier_run(replace_in_checkpoint("rank_state.json", rank_state_wrong_size), "--resume"),
        ("rank_state.json is not the ranks' saved state",)),
    "resume with another sample cap (item 7)": Case(
        earlier_run(lambda out: None, "--resume", "--set", "data.max_train_samples=8"), ("data.max_train_samples",)),
}

# cases that fail today: the reason names what is wrong and whose code it is in (remove the mark when fixed)
MARKS: dict = {}  # none now (a failed fresh run leaves its output as it was, report errors name the file: planning)

# Bad input that a run survives: it goes on (exit 0) after a warning naming what it left out, and
# nothing is lost (every byte of the earlier run's checkpoints and metrics.jsonl is still in the
# output folder, moved aside at most).
WARNED = {
    "resume, malformed manifest (item 4)": Case(earlier_run(edit_manifest(lambda m: "{"), "--resume"),
                                                ("epoch-0001", "manifest.json is not readable JSON"), 0),
    "resume, manifest naming ../ (item 4)": Case(earlier_run(edit_manifest(manifest_escaping), "--resume"),
                                                 ("epoch-0001", "../../in/data/train/a/0.png"), 0),
    "resume, empty manifest over truncated weights (item 4)": Case(
        earlier_run(truncate_weights_listing_nothing, "--resume"), ("epoch-0001", "'files' must list"), 0),
    "resume, torn metrics line (item 7)": Case(
        earlier_run(lambda out: (out / "metrics.jsonl").write_text((out / "metrics.jsonl").read_text() + '{"epo'),
                    "--resume", "--epochs", "2"), ("metrics.jsonl",), 0),
}


# --- running a case in-process -------------------------------------------------------------------

@dataclass
class Outcome:
    exit_code: int
    stderr: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def hvdtrain(argv: list[str]) -> Outcome:
    """``hvdtrain ARGV`` in this process; what it left in os.environ (Horovod's controller, the
    CLI's TF_CPP_MIN_LOG_LEVEL) is put back. An exception other than the exit escapes (a crash).
    A mapping first in ``argv`` holds environment variables for this command only."""
    before = dict(os.environ)
    env = argv[0] if argv and isinstance(argv[0], dict) else None
    try:
        result = CliRunner(env=env).invoke(main, argv[1:] if env else argv, prog_name="hvdtrain",
                                           catch_exceptions=False)
    finally:
        restore_environ(before)
    return Outcome(result.exit_code, result.stderr)


def snapshot(root: Path) -> dict[str, bytes | None] | None:
    """Every path under ``root`` with its bytes (None for a folder); None if ``root`` does not exist."""
    if not root.exists():
        return None
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """``(in, out)`` under tmp_path; the image index and token caches live under tmp_path too."""
    monkeypatch.setenv("HVDTRAIN_DATA_CACHE", str(tmp_path / "cache" / "data"))
    monkeypatch.setenv("HVDTRAIN_CACHE_DIR", str(tmp_path / "cache" / "tokens"))
    monkeypatch.delenv("HVDTRAIN_TRACEBACK", raising=False)
    monkeypatch.delenv("HVDTRAIN_FAULT", raising=False)
    (tmp_path / "in").mkdir()
    return tmp_path / "in", tmp_path / "out"


FINISHED: dict[str, Path] = {}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One finished one-epoch run (a checkpoint, metrics.jsonl, config.yaml) that output cases copy."""
    root = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HVDTRAIN_DATA_CACHE", str(root / "cache"))
        outcome = hvdtrain(recipe(image_tree(root / "in" / "data"), root / "out"))
    assert outcome.exit_code == 0, outcome.stderr
    FINISHED.update(out=root / "out", data=root / "in" / "data")
    return root / "out"


def check(case: Case, inp: Path, out: Path, outcome_of: Callable[[list[str]], Outcome]) -> None:
    argv = case.make(inp, out)
    inputs, output = snapshot(inp), snapshot(out)
    outcome = outcome_of(argv)
    assert outcome.exit_code == case.exit, f"exit {outcome.exit_code}, not {case.exit}:\n{outcome.stderr}"
    assert "Traceback" not in outcome.stderr, outcome.stderr
    for needle in case.needles:
        assert needle in outcome.last_line, f"{needle!r} not in the last line:\n{outcome.stderr}"
    assert "s3cr3t" not in outcome.stderr, f"a secret of a URI shown:\n{outcome.stderr}"
    assert outcome.last_line.startswith(("hvdtrain: error: ", "Error: ")), outcome.stderr
    assert snapshot(inp) == inputs, "the input tree changed"
    after = snapshot(out)
    if output is None and after == {}:  # a fresh output folder made and left empty: nothing in it to lose
        after = None
    assert after == output, f"the output folder changed: {sorted(after or {})}"


def needs_finished_run(case: Case, request) -> None:
    if getattr(case.make, "needs_finished_run", False):
        request.getfixturevalue("finished_run")


@pytest.mark.parametrize("name", [pytest.param(name, marks=MARKS.get(name, ()), id=name) for name in CASES])
def test_bad_input(name, isolated, request):
    case = CASES[name]
    needs_finished_run(case, request)
    check(case, *isolated, hvdtrain)


@pytest.mark.parametrize("name", [pytest.param(name, marks=MARKS.get(name, ()), id=name) for name in WARNED])
def test_bad_input_survived(name, isolated, request):
    case = WARNED[name]
    needs_finished_run(case, request)
    inp, out = isolated
    argv = case.make(inp, out)
    inputs = snapshot(inp)
    kept = [data for path, data in (snapshot(out) or {}).items()
            if data is not None and (path.startswith("checkpoints/") or path == "metrics.jsonl")]
    outcome = hvdtrain(argv)
    assert outcome.exit_code == 0, outcome.stderr
    assert "Traceback" not in outcome.stderr, outcome.stderr
    warnings = [line for line in outcome.stderr.splitlines() if line.startswith("hvdtrain: warning: ")]
    assert any(all(needle in line for needle in case.needles) for line in warnings), outcome.stderr
    assert snapshot(inp) == inputs, "the input tree changed"
    now = [data for data in (snapshot(out) or {}).values() if data is not None]
    lost = [data[:60] for data in kept if not any(data in later for later in now)]
    assert not lost, f"bytes of the earlier run lost: {lost}"


IN_A_PROCESS = ("wrong type (--set)", "empty class folder")


@pytest.mark.parametrize("name", IN_A_PROCESS)
def test_bad_input_in_a_process(name, isolated):
    """The same check through a real ``hvdtrain`` process: its exit code, and the error as the
    last line of stderr after Horovod's shutdown."""
    def in_a_process(argv):
        proc = run([hvdtrain_cli(), *argv], check=False)
        return Outcome(proc.returncode, proc.stderr)
    check(CASES[name], *isolated, in_a_process)


# --- on two ranks (real horovodrun jobs) --------------------------------------------------------------

@pytest.mark.distributed
def test_unreadable_image_is_replaced_and_counted_on_two_ranks(tmp_path):
    data = image_tree(tmp_path / "data")
    (data / "train" / "a" / "broken.png").write_bytes(b"this is not a png")
    proc = horovodrun([hvdtrain_cli(), *recipe(data, tmp_path / "out", "--set", "data.bad_files=skip")])
    # found when decoded, on whichever rank meets it; a stand-in keeps every rank's step count
    assert "1 unreadable train image(s) replaced by stand-ins" in proc.stderr and "broken.png" in proc.stderr
    assert "25 train" in proc.stdout


@pytest.mark.distributed
def test_fewer_samples_than_workers(tmp_path):
    data = image_tree(tmp_path / "data")
    proc = horovodrun([hvdtrain_cli(), *recipe(data, tmp_path / "out", "--set", "data.max_train_samples=1")],
                      check=False)
    assert proc.returncode != 0 and "1 training samples cannot be shared by 2 workers" in proc.stdout + proc.stderr
