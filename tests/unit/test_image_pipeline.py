"""The framework-free image pipeline: determinism across worker counts and resumes, errors named from
inside a worker, deterministic stand-ins for bad files, no worker outliving a killed trainer, and
the flat ImageNet validation layout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from hvdtrain.core import sharding
from hvdtrain.data.index import DataError, load_index
from hvdtrain.data.workers import WorkerPool
from hvdtrain.data import ImageOptions as ImageConfig
from hvdtrain.data import open_images

CLASSES = ("ant", "bee", "cat")


def opened(*args, **kwargs):
    """Train, val and classes of :func:`hvdtrain.data.open_images`."""
    data = open_images(*args, **kwargs)
    return data.train, data.val, data.classes


def photo(rng, width=200, height=150):
    """A smooth colour image (gradients and blobs: JPEG-friendly, unlike noise)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    a, b, c = rng.uniform(0.01, 0.08, 3)
    img = np.stack([np.sin(x * a + y * b), np.cos(y * c), np.sin((x + y) * (a + c) / 2)], axis=-1)
    return ((img * 0.5 + 0.5) * 255).astype(np.uint8)


def jpeg_tree(root, per_class=6, flat_val=False):
    rng = np.random.default_rng(0)
    rows = ["ImageId,PredictionString"]
    for split in ("train", "val"):
        for cls in CLASSES:
            for i in range(per_class):
                array = photo(rng, width=int(rng.integers(160, 260)), height=int(rng.integers(120, 200)))
                if split == "val" and flat_val:
                    name = f"ILSVRC2012_val_{len(rows):08d}"
                    path = root / "val" / f"{name}.JPEG"
                    rows.append(f"{name},{cls} 1 2 3 4 {cls} 5 6 7 8")
                else:
                    path = root / split / cls / f"{i:03d}.JPEG"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(array).save(path, quality=90)
    if flat_val:
        (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


pytestmark = pytest.mark.usefixtures("private_index_cache")


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(2)
    yield pool
    pool.close()


def datasets(root, pool=None, **image):
    return opened(root, ImageConfig(**{"size": 32, "workers": 0, **image}), seed=5, pool=pool)


def test_one_and_two_workers_give_bitwise_identical_batches(tmp_path, pool):
    root = jpeg_tree(tmp_path / "d")
    inline_train, inline_val, _ = datasets(root)
    train, val, _ = datasets(root, pool)
    one = WorkerPool(1)
    try:
        single_train, _, _ = datasets(root, one)
        for epoch in (0, 1):
            order = sharding.train_shard(len(train), 0, 1, epoch, seed=5)
            for batch in sharding.batches(order, 7):
                a, la = inline_train.get_batch(batch, epoch)
                b, lb = train.get_batch(batch, epoch)
                c, lc = single_train.get_batch(batch, epoch)
                assert a.dtype == np.uint8 and a.shape == (len(batch), 32, 32, 3)
                assert np.array_equal(a, b) and np.array_equal(a, c)
                assert np.array_equal(la, lb) and np.array_equal(la, lc)
    finally:
        one.close()
    x, _ = val.get_batch(np.arange(len(val)), -1)
    assert np.array_equal(x, inline_val.get_batch(np.arange(len(val)), -1)[0])
    first, _ = train.get_batch(np.arange(6), 0)
    assert not np.array_equal(first, train.get_batch(np.arange(6), 1)[0])  # a new epoch draws new crops


def test_mid_epoch_resume_gives_the_same_batches(tmp_path, pool):
    root = jpeg_tree(tmp_path / "d")
    train, _, _ = datasets(root, pool)
    full = sharding.batches(sharding.train_shard(len(train), 1, 2, 3, seed=5), 4)
    before = [train.get_batch(b, 3)[0] for b in full]
    resumed_train, _, _ = datasets(root, WorkerPool(2))  # a new process: new workers, index from the cache
    consumed = 2 * 4 * 2  # two batches of 4 on each of 2 ranks
    rest = sharding.batches(sharding.train_shard(len(train), 1, 2, 3, seed=5, start=consumed), 4)
    after = [resumed_train.get_batch(b, 3)[0] for b in rest]
    assert len(after) == len(before) - 2
    for a, b in zip(before[2:], after):
        assert np.array_equal(a, b)
    resumed_train.pool.close()


def test_corrupt_jpeg_is_named_from_inside_a_worker(tmp_path, pool):
    root = jpeg_tree(tmp_path / "d")
    bad = root / "train" / "bee" / "002.JPEG"
    bad.write_bytes(bad.read_bytes()[:300])  # a truncated JPEG: its header is cut short
    cut = root / "train" / "cat" / "003.JPEG"
    cut.write_bytes(cut.read_bytes()[:len(cut.read_bytes()) // 2])  # the header reads, the pixels end halfway
    train, _, _ = datasets(root, pool)
    for path, relpath, reason in ((bad, "bee/002.JPEG", ""), (cut, "cat/003.JPEG", "Premature end of JPEG file")):
        row = next(i for i in range(len(train)) if train.index.relpath(i) == relpath)
        with pytest.raises(DataError) as err:
            train.get_batch(np.array([0, row, 1]), 0)
        assert str(path) in str(err.value) and reason in str(err.value) and "image.bad_files=skip" in str(err.value)
    x, _ = train.get_batch(np.array([0, 1]), 0)  # the pool keeps working afterwards
    assert x.shape[0] == 2


def test_skip_substitutes_the_same_stand_in_everywhere(tmp_path, pool, capsys):
    root = jpeg_tree(tmp_path / "d")
    (root / "train" / "cat" / "001.JPEG").write_bytes(b"not a jpeg at all")
    train, _, _ = datasets(root, pool, bad_files="skip")
    inline, _, _ = datasets(root, bad_files="skip")
    row = next(i for i in range(len(train)) if train.index.relpath(i) == "cat/001.JPEG")
    batch = np.array([row, 0, row])
    a, la = train.get_batch(batch, 0)
    b, lb = inline.get_batch(batch, 0)
    assert a.shape[0] == 3 and np.array_equal(a, b) and np.array_equal(la, lb)  # same stand-in, same label
    assert np.array_equal(a[0], a[2])
    train.get_batch(np.array([0]), 1)  # a new epoch reports the last one
    err = capsys.readouterr().err
    assert "epoch 1: 2 unreadable train image(s) replaced" in err and "001.JPEG" in err
    assert len(train) == len(inline) == 18  # the file stays in the dataset: every rank keeps its step count


def test_flat_validation_folder_with_labels_file(tmp_path):
    root = jpeg_tree(tmp_path / "d", flat_val=True)
    train, val, classes = datasets(root, val_labels=str(root / "LOC_val_solution.csv"))
    assert classes == list(CLASSES) and len(val) == 18
    labels = val.labels_of(np.arange(len(val)))
    assert sorted(np.bincount(labels).tolist()) == [6, 6, 6]
    assert val.index.relpath(0).startswith("ILSVRC2012_val_")
    x, _ = val.get_batch(np.arange(3), -1)
    assert x.shape == (3, 32, 32, 3)
    (root / "val" / "stray.JPEG").write_bytes((root / "val" / "ILSVRC2012_val_00000001.JPEG").read_bytes())
    with pytest.raises(DataError, match="stray.JPEG has no row in the labels file"):
        datasets(root, val_labels=str(root / "LOC_val_solution.csv"))


KILLED_TRAINER = """
import sys, time
from hvdtrain.data.workers import WorkerPool
pool = WorkerPool(2)
print(" ".join(map(str, pool.pids)), flush=True)
time.sleep(60)
"""


def test_no_worker_outlives_a_sigkilled_trainer():
    proc = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _running(p)]
    assert not alive, f"data workers {alive} outlived the trainer"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_index_is_compact(tmp_path):
    root = jpeg_tree(tmp_path / "d")
    index = load_index(root / "train")
    assert index.nbytes < 40 * len(index) + 100


def test_a_script_without_a_main_guard_can_start_workers(tmp_path):
    """spawn would re-run the user's script in each worker; the pool keeps workers from importing it."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "train_script.py"
    script.write_text(
        "from hvdtrain.data.workers import WorkerPool\n"
        f"open({str(marker)!r}, 'a').write('ran\\n')\n"
        "pool = WorkerPool(2)\n"
        "pool.close()\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
    assert marker.read_text() == "ran\n"  # the script ran once: in the trainer, not again in each worker


def test_workers_outlive_the_signals_a_scheduler_sends_to_every_process(tmp_path, pool):
    """Slurm signals every process of a step (USR1 before a time limit, TERM on preemption): the
    trainer turns them into a checkpoint and an exit, so its decoding workers must not die of them."""
    import os
    import signal

    root = jpeg_tree(tmp_path / "d")
    train, _, _ = datasets(root, pool)
    before, _ = train.get_batch(np.arange(6), 0)
    for pid in pool.pids:
        for number in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            os.kill(pid, number)
    after, _ = train.get_batch(np.arange(6), 0)  # the same workers decode the same batch
    assert np.array_equal(before, after)
    assert all(proc.is_alive() for proc in pool.procs)
