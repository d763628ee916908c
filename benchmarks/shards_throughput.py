"""Images/s from WebDataset tar shards against the same photos as an ImageFolder tree, and over HTTP.

The photos: a real-photo tree (:mod:`benchmarks.photo_tree`, about 500x375 JPEGs, quality 90),
converted to tar shards by ``hvdtrain convert`` (the way a user makes them). Every contender is
the recipe's own path: :class:`hvdtrain.data.pipeline.ImageDataset` with RandomResizedCrop 224 +
flip, batches of 64 through the decoding workers (:class:`~hvdtrain.data.workers.WorkerPool`),
one epoch's shuffled order per pass:

* ``folder``: the ImageFolder tree (one file per image);
* ``tars``: the tar shards on the local disk, random access (one ``pread`` per image);
* ``http-random``: the same tars from the project's nginx on loopback (scripts/http-server.sh),
  random access: one range request per image, sent by the decoding workers;
* ``http-stream``: the same URLs in streaming mode (image.read=stream, one lane, a spool of 4
  shards): whole shards downloaded ahead by the trainer, the workers reading the local copies;
* ``mount-folder`` and ``mount-tars`` (with ``--mount DIR``, where DIR is the work folder as seen
  through a network filesystem, e.g. sshfs over loopback from benchmarks/sshfs_stand_in.sh): the
  tree and the tars read through that mount, their ratio taken to ``mount-folder``.

``--only`` picks contenders; ``--drop-caches`` (root) syncs and drops the page cache before every
pass, so no pass is served from memory what an earlier one read.

Rounds are interleaved (every contender once per round, in turn), so load on a shared machine hits
them alike; the table gives the median images/s (wall clock), images per CPU-second of the trainer
and its workers together (the server's CPU not counted), and each contender's ratio to ``folder``.
For streaming, the seconds the batches waited for downloads are reported too.

    .venv/bin/python benchmarks/shards_throughput.py /tmp/shards-bench --per-class 100 --workers 2 --rounds 5
    benchmarks/sshfs_stand_in.sh up /tmp/shards-bench /mnt/shards-bench
    .venv/bin/python benchmarks/shards_throughput.py /tmp/shards-bench --mount /mnt/shards-bench \
        --only folder,tars,mount-folder,mount-tars --drop-caches --workers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import photo_tree  # noqa: E402
from hvdtrain.core import sharding  # noqa: E402
from hvdtrain.data import braces, remote  # noqa: E402
from hvdtrain.data.convert import convert  # noqa: E402
from hvdtrain.data.index import load_index  # noqa: E402
from hvdtrain.data.pipeline import ImageDataset  # noqa: E402
from hvdtrain.data.shards import load_shard_index  # noqa: E402
from hvdtrain.data.stream import open_stream  # noqa: E402
from hvdtrain.data.transforms import TransformPolicy  # noqa: E402
from hvdtrain.data.workers import WorkerPool  # noqa: E402

POLICY = TransformPolicy("imagenet", 224)
BATCH = 64
SEED = 7
CONTENDERS = ("folder", "tars", "http-random", "http-stream", "mount-folder", "mount-tars")


def prepare(root: Path, per_class: int, per_shard: int) -> tuple[Path, list[Path]]:
    """The photo tree (8 classes) and its tar shards, made once under ``root``."""
    tree, wds = root / "photos", root / "wds"
    if not (tree / "train").is_dir():
        photo_tree.make_tree(tree, classes=len(photo_tree.PHOTOS), train=per_class, val=1)
    if not (wds / "manifest.json").is_file():
        convert(tree, wds, "webdataset", splits=["train"], samples_per_shard=per_shard, workers=2)
    return tree, sorted(wds.glob("train-*.tar"))


def serve(root: Path) -> tuple[subprocess.Popen, str]:
    """scripts/http-server.sh serving ``root`` on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(REPO / "scripts" / "http-server.sh"), str(root), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/wds/manifest.json", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit("scripts/http-server.sh did not start (is nginx installed? scripts/http-server.sh --setup)")


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds of this process (all threads) and of ``pids`` so far."""
    total = time.process_time()
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def drop_caches() -> None:
    """Write dirty pages out and drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        raise SystemExit(f"--drop-caches: cannot write /proc/sys/vm/drop_caches ({error}); run as root") from None


def one_pass(dataset: ImageDataset, epoch: int, pids: list[int], cold: bool = False) -> tuple[float, float]:
    """Images/s and images per CPU-second of one epoch in the loop's shuffled order, batches of 64
    (after dropping the page cache when ``cold``)."""
    if cold:
        drop_caches()
    n = len(dataset)
    order = sharding.train_shard(n, 0, 1, epoch, SEED)
    started, cpu = time.perf_counter(), cpu_seconds(pids)
    for batch in sharding.batches(order, BATCH):
        dataset.get_batch(batch, epoch)
    wall, used = time.perf_counter() - started, cpu_seconds(pids) - cpu
    return n / wall, n / used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="work folder: the photo tree and its shards are made here once")
    parser.add_argument("--per-class", type=int, default=100, help="training photos per class (8 classes)")
    parser.add_argument("--per-shard", type=int, default=100, help="samples per tar shard")
    parser.add_argument("--workers", type=int, default=2, help="decoding worker processes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-http-random", action="store_true", help="leave out random access over HTTP")
    parser.add_argument("--mount", default=None,
                        help="the work folder as seen through a network filesystem (benchmarks/sshfs_stand_in.sh)")
    parser.add_argument("--only", default=None, help=f"comma-separated contenders, of {', '.join(CONTENDERS)}")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before every pass (root)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    names = [n for n in CONTENDERS if args.mount or not n.startswith("mount-")]
    if args.skip_http_random:
        names.remove("http-random")
    if args.only:
        wanted = args.only.split(",")
        bad = [n for n in wanted if n not in CONTENDERS]
        if bad:
            raise SystemExit(f"--only: unknown contender(s) {', '.join(bad)}; choose from {', '.join(CONTENDERS)}")
        if not args.mount and any(n.startswith("mount-") for n in wanted):
            raise SystemExit("--only: mount-folder and mount-tars need --mount DIR")
        names = wanted
    if not photo_tree.available():
        raise SystemExit("the photo tree needs scikit-image's data files: pip install scikit-image==0.26.0")
    root = Path(args.root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HVDTRAIN_DATA_CACHE", str(root / "cache"))
    tree, tars = prepare(root, args.per_class, args.per_shard)
    mount = Path(args.mount).absolute() if args.mount else None
    if mount and not (mount / "wds" / "manifest.json").is_file():
        raise SystemExit(f"--mount {mount}: no wds/manifest.json there; mount {root} at it first")
    http = any(n.startswith("http-") for n in names)
    server, url = serve(root) if http else (None, "")
    pool = WorkerPool(args.workers)
    stream = None

    def folder(base: Path) -> ImageDataset:
        return ImageDataset(load_index(base / tree.name / "train"), POLICY, train=True, seed=SEED, pool=pool)

    def shards(base: Path) -> ImageDataset:
        return ImageDataset(load_shard_index(braces.resolve(str(base / "wds"), extensions=(".tar",)), "webdataset"),
                            POLICY, train=True, seed=SEED, pool=pool)

    try:
        contenders = {}
        if http:
            urls = remote.expand(f"{url}/wds/train-{{000000..{len(tars) - 1:06d}}}.tar")
            remote_index = load_shard_index(urls, "webdataset")
            stream = open_stream(remote_index, None, lanes=1, seed=SEED, shuffle=True, train=True,
                                 max_bytes=2 << 30, max_shards=4, spool_dir=str(root))
        makers = {"folder": lambda: folder(root), "tars": lambda: shards(root),
                  "http-random": lambda: ImageDataset(remote_index, POLICY, train=True, seed=SEED, pool=pool),
                  "http-stream": lambda: ImageDataset(remote_index, POLICY, train=True, seed=SEED, pool=pool,
                                                      stream=stream),
                  "mount-folder": lambda: folder(mount), "mount-tars": lambda: shards(mount)}
        for name in names:
            contenders[name] = makers[name]()
        sizes = {len(d) for d in contenders.values()}
        assert len(sizes) == 1, sizes
        for dataset in contenders.values():  # warm-up: page cache, workers' readers, the server's connections
            dataset.get_batch(np.arange(BATCH), 0)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
        waited = 0.0
        for r in range(args.rounds):
            for name, dataset in contenders.items():
                before = stream.spool.waited if stream else 0.0
                results[name].append(one_pass(dataset, r + 1, pool.pids, cold=args.drop_caches))
                if name == "http-stream":
                    waited += stream.spool.waited - before
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1][0]:.0f}/s" for n, v in results.items()), flush=True)
    finally:
        pool.close()
        if server:
            server.terminate()
            server.wait()
    rows = []
    for name, values in results.items():
        # each contender against the folder read the same way: the local tree, or the tree on the mount
        base = results.get("mount-folder" if name.startswith("mount-") else "folder")
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        row = {"contender": name, "images_per_s": round(wall, 1), "images_per_cpu_s": round(cpu, 1),
               "ratio_to_folder": None, "cpu_ratio_to_folder": None}
        if base:
            row["ratio_to_folder"] = round(wall / statistics.median(v[0] for v in base), 3)
            row["cpu_ratio_to_folder"] = round(cpu / statistics.median(v[1] for v in base), 3)
        rows.append(row)
    n = len(next(iter(contenders.values())))
    print(f"\n{n} photos (about 500x375 JPEG q90, {len(tars)} tar shards of {args.per_shard}), RandomResizedCrop 224 "
          f"+ flip, batches of {BATCH}, {args.workers} decoding worker(s), median of {args.rounds} interleaved rounds"
          + (", page cache dropped before every pass" if args.drop_caches else ""))
    print(f"{'contender':<12} {'images/s':>9} {'per CPU-s':>10} {'vs folder':>10} {'CPU vs folder':>14}")
    for row in rows:
        ratios = [f"{row[k]:.3f}" if row[k] is not None else "-" for k in ("ratio_to_folder", "cpu_ratio_to_folder")]
        print(f"{row['contender']:<12} {row['images_per_s']:>9.1f} {row['images_per_cpu_s']:>10.1f} "
              f"{ratios[0]:>10} {ratios[1]:>14}")
    wait_fraction = None
    if "http-stream" in results:
        total = sum(n / v[0] for v in results["http-stream"])
        wait_fraction = round(waited / total, 4)
        print(f"http-stream: batches waited {waited:.2f} s for downloads over {total:.1f} s of passes "
              f"({100 * waited / total:.1f} %); {stream.spool.fetched} whole-shard downloads, "
              f"peak spool {stream.spool.peak_bytes / 2**20:.1f} MiB")
    if stream:
        stream.close()
    command = "benchmarks/shards_throughput.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"command: .venv/bin/python {command}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "images": n, "shards": len(tars),
                                               "workers": args.workers, "rounds": args.rounds, "rows": rows,
                                               "drop_caches": args.drop_caches,
                                               "stream_wait_fraction": wait_fraction}, indent=1) + "\n")


if __name__ == "__main__":
    main()
