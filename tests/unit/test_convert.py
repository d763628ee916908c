"""`hvdtrain convert` on a small tree of real-photo JPEGs (crops of scikit-image's photographs):
WebDataset and Parquet round trips read back by the real `webdataset` and `datasets` libraries and
by `--verify`; the flat ImageNet validation layout; byte-identical output with 1 or 2 workers; a
conversion whose worker is killed mid-shard finished by a re-run that keeps the finished shards;
refusal of a DEST that is not this conversion's; --verify naming a changed image, a missing one
and a changed label; the CLI's exit codes and one-line errors."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from jobs import hvdtrain_cli, job_env

from benchmarks import photo_tree  # noqa: E402
from hvdtrain.data.convert import ConvertError, convert, make_plan
from hvdtrain.data.convert_shards import ROW_GROUP, WORK_DIR, partial_of
from hvdtrain.data.convert_verify import verify
from hvdtrain.data.index import load_index

if not photo_tree.available() and os.environ.get("CI") != "true":
    pytest.skip("scikit-image's photos are not installed (scripts/install.sh adds scikit-image==0.26.0)",
                allow_module_level=True)

TRAIN = 40  # per class: 120 training images, so a Parquet shard has more than one row group


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return photo_tree.make_tree(tmp_path_factory.mktemp("photos"), classes=3, train=TRAIN, val=4, size=(64, 48))


pytestmark = pytest.mark.usefixtures("private_index_cache")


def source_images(root: Path, split: str) -> dict[str, tuple[bytes, str]]:
    """relative path -> (bytes, class folder) of an ImageFolder split."""
    return {p.relative_to(root / split).as_posix(): (p.read_bytes(), p.parent.name)
            for p in sorted((root / split).glob("*/*"))}


def digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_webdataset_round_trip_read_by_webdataset_and_verify(tree, tmp_path):
    import webdataset as wds

    dest = tmp_path / "wds"
    result = convert(tree, dest, "webdataset", samples_per_shard=25)
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["format"] == "webdataset" and manifest["classes"] == ["astronaut", "chelsea", "coffee"]
    assert [s["name"] for s in manifest["splits"]["train"]["shards"]] == [f"train-{i:06d}.tar" for i in range(5)]
    assert manifest["splits"]["train"]["samples"] == 3 * TRAIN and manifest["splits"]["val"]["samples"] == 12
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["manifest.json"] + [f"train-{i:06d}.tar" for i in range(5)] + ["val-000000.tar"])  # no work folder left
    assert result.written == 6 and result.kept == 0
    for entry in manifest["splits"]["train"]["shards"]:
        assert hashlib.sha256((dest / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    with tarfile.open(dest / "train-000000.tar") as tar:
        members = tar.getmembers()
    assert {m.mtime for m in members} == {946684800} and {(m.uid, m.gid, m.uname) for m in members} == {(0, 0, "")}
    assert members[0].name.endswith(".jpeg") and members[1].name == members[0].name[:-5] + ".cls"

    # the real webdataset reader sees every image once, bytes untouched, with its class index
    source = source_images(tree, "train")
    classes = manifest["classes"]
    seen = {}
    for sample in wds.WebDataset(str(dest / "train-{000000..000004}.tar"), shardshuffle=False, empty_check=False):
        relpath = sample["__key__"].replace("%2F", "/") + ".JPEG"
        assert "." not in sample["__key__"] and relpath not in seen
        seen[relpath] = (sample["jpeg"], classes[int(sample["cls"])])
    assert seen == source
    # shuffled by default: the first shard mixes the classes (a sorted tree would give one)
    with tarfile.open(dest / "train-000000.tar") as tar:
        labels = {tar.extractfile(m).read() for m in tar if m.name.endswith(".cls")}
    assert len(labels) == 3

    checked = verify(dest, tree)
    assert checked.ok, checked.problems
    assert checked.samples == 3 * TRAIN + 12 and checked.shards == 6


def test_parquet_read_by_datasets_as_image_and_classlabel(tree, tmp_path):
    import datasets
    import pyarrow.parquet as pq

    dest = tmp_path / "pq"
    convert(tree, dest, "parquet", shard_size="10MB")
    names = sorted(p.relative_to(dest).as_posix() for p in (dest / "data").iterdir())
    assert names == ["data/train-00000-of-00001.parquet", "data/val-00000-of-00001.parquet"]
    meta = pq.ParquetFile(dest / names[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [ROW_GROUP, 3 * TRAIN - ROW_GROUP]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(
        names=["astronaut", "chelsea", "coffee"])})
    assert pq.read_schema(dest / names[0]).metadata[b"huggingface"] == features.arrow_schema.metadata[b"huggingface"]

    loaded = datasets.load_dataset("parquet", data_files={"train": str(dest / "data/train-*.parquet"),
                                                          "validation": str(dest / "data/val-*.parquet")},
                                   cache_dir=str(tmp_path / "hf"))
    train = loaded["train"]
    assert isinstance(train.features["image"], datasets.Image)
    assert isinstance(train.features["label"], datasets.ClassLabel)
    assert train.features["label"].names == ["astronaut", "chelsea", "coffee"]
    assert len(train) == 3 * TRAIN and len(loaded["validation"]) == 12
    assert train[0]["image"].size == (64, 48) or train[0]["image"].size == (48, 64)  # decoded as a PIL image
    source = source_images(tree, "train")
    raw = train.cast_column("image", datasets.Image(decode=False))
    got = {row["image"]["path"]: (row["image"]["bytes"], train.features["label"].int2str(row["label"])) for row in raw}
    assert got == source
    assert verify(dest, tree, workers=2).ok


def flat_val(tree: Path, root: Path) -> Path:
    """``root``: the tree's train split, and its val split as ImageNet ships it (a flat folder and
    LOC_val_solution.csv)."""
    shutil.copytree(tree / "train", root / "train")
    (root / "val").mkdir()
    rows = ["ImageId,PredictionString"]
    for n, path in enumerate(sorted((tree / "val").glob("*/*"))):
        name = f"ILSVRC2012_val_{n + 1:08d}"
        shutil.copy(path, root / "val" / f"{name}.JPEG")
        rows.append(f"{name},{path.parent.name} 1 2 3 4 {path.parent.name} 5 6 7 8")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


def test_flat_validation_layout(tree, tmp_path):
    root = flat_val(tree, tmp_path / "imagenet")
    with pytest.raises(ConvertError, match=r"val is a flat folder of images: give its labels CSV with --val-labels"):
        convert(root, tmp_path / "refused", "webdataset")
    assert not (tmp_path / "refused").exists()
    dest = tmp_path / "wds"
    convert(root, dest, "webdataset", splits=("val",), val_labels=root / "LOC_val_solution.csv")
    manifest = json.loads((dest / "manifest.json").read_text())
    assert list(manifest["splits"]) == ["val"] and manifest["classes"] == ["astronaut", "chelsea", "coffee"]
    assert manifest["source"]["splits"]["val"]["labels_file"] == str((root / "LOC_val_solution.csv").resolve())
    with tarfile.open(dest / "val-000000.tar") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar}
    expected = {}
    for n, path in enumerate(sorted((tree / "val").glob("*/*"))):
        key = f"ILSVRC2012_val_{n + 1:08d}"
        expected[f"{key}.jpeg"] = path.read_bytes()
        expected[f"{key}.cls"] = str(["astronaut", "chelsea", "coffee"].index(path.parent.name)).encode()
    assert got == expected
    assert verify(dest, root).ok  # the labels file recorded in the manifest


def test_output_is_byte_identical_with_one_or_two_workers(tree, tmp_path):
    for fmt in ("webdataset", "parquet"):
        convert(tree, tmp_path / f"{fmt}1", fmt, samples_per_shard=30, workers=1)
        convert(tree, tmp_path / f"{fmt}2", fmt, samples_per_shard=30, workers=2)
        one, two = digests(tmp_path / f"{fmt}1"), digests(tmp_path / f"{fmt}2")
        assert one == two and len(one) == 1 + 4 + 1


def test_worker_killed_mid_shard_is_finished_by_a_rerun_keeping_finished_shards(tree, tmp_path):
    """A source image replaced by a FIFO (the cached index unchanged) stops a worker mid-shard
    until the conversion is SIGKILLed; the rerun keeps the other shards and redoes that one."""
    src = tmp_path / "src"
    shutil.copytree(tree, src)
    load_index(src / "train")  # cached now: the FIFO below does not change the index
    plan = make_plan(src, tmp_path / "dest", "webdataset", samples_per_shard=10)
    stuck = plan.tasks[5]
    victim = src / "train" / stuck.relpaths[4]
    original, folder_times = victim.read_bytes(), os.stat(victim.parent)
    victim.unlink()
    os.mkfifo(victim)
    os.utime(victim.parent, ns=(folder_times.st_atime_ns, folder_times.st_mtime_ns))
    cmd = [hvdtrain_cli(), "convert", str(src), str(tmp_path / "dest"), "--to", "webdataset",
           "--samples-per-shard", "10", "--workers", "2"]
    proc = subprocess.Popen(cmd, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    records = tmp_path / "dest" / WORK_DIR
    try:
        deadline = time.monotonic() + 60
        while len(list(records.glob("*.tar.json"))) < len(plan.tasks) - 1:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
            time.sleep(0.05)
        partial = [p for p in (tmp_path / "dest").iterdir() if partial_of(p.name)]
        assert [partial_of(p.name) for p in partial] == [stuck.name]
        assert partial[0].stat().st_size > 0  # four images written, the fifth never comes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert not (tmp_path / "dest" / "manifest.json").exists()
    victim.unlink()
    victim.write_bytes(original)
    os.utime(victim.parent, ns=(folder_times.st_atime_ns, folder_times.st_mtime_ns))
    kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "dest").glob("*.tar")}
    assert stuck.name not in kept and len(kept) == len(plan.tasks) - 1

    result = convert(src, tmp_path / "dest", "webdataset", samples_per_shard=10)
    assert (result.written, result.kept) == (1, len(plan.tasks) - 1)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "dest").glob("*.tar")
            if p.name != stuck.name} == kept
    assert not [p for p in (tmp_path / "dest").iterdir() if partial_of(p.name) or p.name == WORK_DIR]
    convert(src, tmp_path / "fresh", "webdataset", samples_per_shard=10)
    assert digests(tmp_path / "dest") == digests(tmp_path / "fresh")  # manifest included
    again = convert(src, tmp_path / "dest", "webdataset", samples_per_shard=10)  # finished: nothing to do
    assert (again.written, again.kept) == (0, len(plan.tasks))


def test_dest_of_another_conversion_or_with_users_files_is_refused(tree, tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    (users / ".notes.txt.partial-7").write_text("also mine")  # named like a temporary shard, of no shard
    with pytest.raises(ConvertError, match=r"DEST .*users holds files that are not this conversion's: "
                                           r"\.notes\.txt\.partial-7, notes\.txt; choose a new or empty folder"):
        convert(tree, users, "webdataset")
    assert sorted(os.listdir(users)) == [".notes.txt.partial-7", "notes.txt"]
    assert (users / "notes.txt").read_text() == "mine"

    dest = tmp_path / "dest"
    convert(tree, dest, "parquet", samples_per_shard=50)
    before = digests(dest)
    with pytest.raises(ConvertError, match=r"holds another conversion \(.*manifest\.json\): format \"parquet\" "
                                           r"\(now \"webdataset\"\)"):
        convert(tree, dest, "webdataset", samples_per_shard=50)
    with pytest.raises(ConvertError, match=r"options .*\"samples_per_shard\": 50.* \(now .*\"samples_per_shard\": 40"):
        convert(tree, dest, "parquet", samples_per_shard=40)
    (dest / "data" / "extra.parquet").write_bytes(b"not ours")
    with pytest.raises(ConvertError, match=r"not this conversion's: data/extra\.parquet"):
        convert(tree, dest, "parquet", samples_per_shard=50)
    (dest / "data" / "extra.parquet").unlink()
    assert digests(dest) == before


def rewrite_tar(path: Path, change) -> None:
    """Rewrite a tar shard member by member through ``change(name, data) -> data or None (drop)``."""
    out = io.BytesIO()
    with tarfile.open(path) as tar, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as new:
        for member in tar:
            data = change(member.name, tar.extractfile(member).read())
            if data is not None:
                member.size = len(data)
                new.addfile(member, io.BytesIO(data))
    path.write_bytes(out.getvalue())


def test_verify_names_a_changed_image_a_missing_one_and_a_changed_label(tree, tmp_path):
    dest = tmp_path / "wds"
    convert(tree, dest, "webdataset", samples_per_shard=40)
    with tarfile.open(dest / "train-000001.tar") as tar:
        images = [m.name for m in tar if not m.name.endswith(".cls")]
    changed, dropped, relabelled = images[0], images[1].split(".")[0], images[2].split(".")[0] + ".cls"

    def change(name, data):
        if name == changed:
            return data[:-10] + bytes(10)
        if name.startswith(dropped + "."):
            return None
        if name == relabelled:
            return str((int(data) + 1) % 3).encode()
        return data

    rewrite_tar(dest / "train-000001.tar", change)
    result = verify(dest, tree)
    text = "\n".join(result.problems)
    assert f"shard train-000001.tar {changed.split('.')[0]!r}: the image bytes differ from {tree / 'train'}" in text
    assert f"{tree / 'train' / dropped.replace('%2F', '/')}.JPEG is in no shard of split train" in text
    assert f"shard train-000001.tar {relabelled.split('.')[0]!r}: label " in text
    assert "shard train-000001.tar has" in text and "not the manifest's" in text  # its checksum
    assert result.total == 5, result.problems  # and the sample count

    pq_dest = tmp_path / "pq"
    convert(tree, pq_dest, "parquet", samples_per_shard=200)
    import pyarrow as pa
    import pyarrow.parquet as pq

    shard = pq_dest / "data/val-00000-of-00001.parquet"
    table = pq.read_table(shard)
    labels = table.column("label").to_pylist()
    labels[3] = (labels[3] + 1) % 3
    pq.write_table(table.set_column(1, "label", pa.array(labels, pa.int64())), shard)
    result = verify(pq_dest, tree)
    path = table.column("image").to_pylist()[3]["path"]
    assert any(p.startswith(f"shard data/val-00000-of-00001.parquet {path!r}: label ") for p in result.problems)


def cli(*args, check_rc=None):
    proc = subprocess.run([hvdtrain_cli(), "convert", *map(str, args)], capture_output=True, text=True,
                          env=job_env(), timeout=120)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stdout + proc.stderr
    return proc


def test_cli_converts_verifies_and_refuses_in_one_line(tree, tmp_path):
    dest = tmp_path / "pq"
    out = cli(tree, dest, "--to", "parquet", "--samples-per-shard", "50", "--workers", "2", check_rc=0).stdout
    lines = out.splitlines()
    assert sorted(line.split("  ")[0] for line in lines[:4]) == [
        "wrote data/train-00000-of-00003.parquet", "wrote data/train-00001-of-00003.parquet",
        "wrote data/train-00002-of-00003.parquet", "wrote data/val-00000-of-00001.parquet"]
    assert lines[4:6] == ["train           120 images in 3 shards", "val              12 images in 1 shard"]
    assert "wrote 4 shards (132 images" in out
    assert "images/s" in out and "MB/s" in out
    assert sorted(glob.glob(str(dest / "data/*.parquet"))) == [str(dest / f"data/train-0000{i}-of-00003.parquet")
                                                                for i in range(3)] + [str(dest / "data/val-00000-of-00001.parquet")]
    assert "ok: 132 images in 4 shards match" in cli("--verify", dest, tree, check_rc=0).stdout

    shard = dest / "data/train-00001-of-00003.parquet"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    err = cli("--verify", dest, tree, check_rc=1).stderr
    assert err.count("\n") == 1 and err.startswith(f"hvdtrain: error: {dest} does not match {tree}: ")
    assert "shard data/train-00001-of-00003.parquet cannot be read" in err and "Traceback" not in err

    err = cli(tree, dest, "--to", "webdataset", check_rc=1).stderr
    assert err.count("\n") == 1 and "holds another conversion" in err
    err = cli(tree, tmp_path / "x", "--to", "parquet", "--shard-size", "12XB", check_rc=1).stderr
    assert err == "hvdtrain: error: shard size '12XB' is not a size: give bytes or a number with one of KB, MB, GB, " \
                  "KiB, MiB, GiB (e.g. 256MB)\n"
    err = cli(tree, tmp_path / "x", "--to", "parquet", "--split", "test", check_rc=1).stderr
    assert err == f"hvdtrain: error: split 'test' is not a folder of {tree}; its folders: train, val\n"
    assert "--to is required" in cli(tree, tmp_path / "x", check_rc=2).stderr
    assert not (tmp_path / "x").exists()
