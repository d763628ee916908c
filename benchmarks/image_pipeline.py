"""Image-pipeline throughput on real-photo JPEGs (about 500x375, quality 90): RandomResizedCrop 224 +
flip to uint8, one process and one thread each, side by side and interleaved in one run.

Contenders per round (the same files, shuffled the same way):

* ``hvdtrain``: :class:`hvdtrain.data.pipeline.ImageDataset` decoding in this process
  (libjpeg-turbo's DCT-scaled decode through ``simplejpeg`` + OpenCV's bit-exact bilinear resize of
  the crop), the recipe's own path; benchmarks/decoders.py compares the decoder candidates;
* ``pillow``: plain Pillow, full decode, the crop box given to ``resize`` (the issue's reference);
* ``tf.data``: ``tf.io.decode_and_crop_jpeg`` + resize 224 + flip, one private thread, intra-op 1;
* ``simplejpeg`` (if installed): libjpeg-turbo DCT-scaled decode (``min_height/min_width``) +
  Pillow crop-box resize, a decoder candidate;
* ``old-recipe``: what the image recipe did before (full decode, resize the whole image to 224,
  reflection pad-crop + flip, float32 normalise).

Then worker scaling: batches of 64 through :class:`~hvdtrain.data.workers.WorkerPool` with 1 and
with 2 worker processes (alternating), images/s of the trainer's ``get_batch`` loop.

    .venv/bin/python benchmarks/photo_tree.py /tmp/photos --train 200 --val 10
    .venv/bin/python benchmarks/image_pipeline.py /tmp/photos --rounds 5 --json benchmarks/image_pipeline.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvdtrain.data.index import load_index  # noqa: E402
from hvdtrain.data.pipeline import ImageDataset  # noqa: E402
from hvdtrain.data.transforms import TransformPolicy, random_resized_box, sample_rng  # noqa: E402
from hvdtrain.data.workers import WorkerPool  # noqa: E402

SIZE = 224
POLICY = TransformPolicy("imagenet", SIZE)


def boxes(paths: list[Path], seed: int) -> list[tuple[int, int, int, int, bool]]:
    """The RandomResizedCrop box and flip of every file (the same for every contender)."""
    out = []
    for i, path in enumerate(paths):
        with Image.open(path) as img:
            w, h = img.size
        rng = sample_rng(seed, 0, i)
        out.append((*random_resized_box(rng, w, h, POLICY.scale, POLICY.ratio), bool(rng.random() < 0.5)))
    return out


def run_pillow(paths, crops) -> None:
    for path, (left, top, w, h, flip) in zip(paths, crops):
        with Image.open(path) as img:
            img = img.convert("RGB")
            out = img.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
        a = np.asarray(out)
        if flip:
            a = a[:, ::-1]


def run_simplejpeg(paths, crops) -> None:
    import simplejpeg

    for path, (left, top, w, h, flip) in zip(paths, crops):
        data = Path(path).read_bytes()
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        reduce = min(w / SIZE, h / SIZE)
        a = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=int(np.ceil(width / reduce)),
                                   min_height=int(np.ceil(height / reduce)))
        sx, sy = a.shape[1] / width, a.shape[0] / height
        out = Image.fromarray(a).resize((SIZE, SIZE), Image.BILINEAR,
                                        box=(left * sx, top * sy, (left + w) * sx, (top + h) * sy))
        a = np.asarray(out)
        if flip:
            a = a[:, ::-1]


def run_old_recipe(paths, crops) -> None:
    pad = SIZE // 8
    for path, (_, top, _, _, flip) in zip(paths, crops):
        with Image.open(path) as img:
            a = np.asarray(img.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR), dtype=np.uint8)
        padded = np.pad(a, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
        crop = padded[top % (2 * pad):top % (2 * pad) + SIZE, :SIZE]
        crop = crop[:, ::-1] if flip else crop
        (crop.astype(np.float32) / 255.0 - 0.45) / 0.225


def tf_pipeline(paths, crops):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    windows = np.asarray([[top, left, h, w] for left, top, w, h, _ in crops], dtype=np.int32)
    flips = np.asarray([f for *_, f in crops])

    def load(path, window, flip):
        image = tf.io.decode_and_crop_jpeg(tf.io.read_file(path), window, channels=3)
        image = tf.image.resize(image, (SIZE, SIZE), method="bilinear", antialias=False)
        image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)

    ds = tf.data.Dataset.from_tensor_slices(([str(p) for p in paths], windows, flips)).map(load)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    ds = ds.with_options(options)

    def run(_paths, _crops):
        for _ in ds:
            pass

    run(None, None)  # trace once
    return run


def run_hvdtrain(dataset: ImageDataset):
    def run(paths, crops):
        for start in range(0, len(dataset), 64):
            dataset.get_batch(np.arange(start, min(start + 64, len(dataset))), 0)
    return run


def timed(fn, paths, crops) -> tuple[float, float]:
    """Images per wall-clock second and per CPU-second of this process (all its threads): on a
    shared machine the CPU-time figure is the steadier measure of images/s per core."""
    started, cpu = time.perf_counter(), time.process_time()
    fn(paths, crops)
    return len(paths) / (time.perf_counter() - started), len(paths) / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="photo tree (benchmarks/photo_tree.py)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=400, help="images per contender per round")
    parser.add_argument("--batches", type=int, default=12, help="batches of 64 per worker-scaling measurement")
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-tf", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HVDTRAIN_DATA_CACHE", "/tmp/hvdtrain-bench-cache")
    index = load_index(Path(args.root) / "train")
    count = min(args.images, len(index))
    paths = [index.path(i) for i in range(count)]
    crops = boxes(paths, seed=1)
    dataset = ImageDataset(index, POLICY, train=True, seed=1, rows=np.arange(count))
    contenders = {"hvdtrain": run_hvdtrain(dataset), "pillow": run_pillow, "old-recipe": run_old_recipe}
    if importlib.util.find_spec("simplejpeg") is not None:
        contenders["simplejpeg"] = run_simplejpeg
    if not args.skip_tf:
        contenders["tf.data"] = tf_pipeline(paths, crops)
    for fn in contenders.values():  # warm the page cache and the code paths
        fn(paths[:32], crops[:32])
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        names = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in names:
            wall, cpu = timed(contenders[name], paths, crops)
            rates[name].append(wall)
            cpu_rates[name].append(cpu)
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s ({cpu_rates[n][-1]:.0f}/cpu-s)"
                                             for n in contenders), flush=True)

    pools = {n: WorkerPool(n) for n in (1, 2)}
    scaled = {n: ImageDataset(index, POLICY, train=True, seed=1, pool=pools[n]) for n in pools}
    batch_list = [np.arange(i * 64, (i + 1) * 64) % len(index) for i in range(args.batches)]
    for ds in scaled.values():
        ds.get_batch(batch_list[0], 0)
    worker_rates: dict[int, list[float]] = {1: [], 2: []}
    loop_cores: dict[int, list[float]] = {1: [], 2: []}  # CPU the trainer's own loop takes, in cores
    for r in range(args.rounds):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            started, cpu_started = time.perf_counter(), time.process_time()
            for b in batch_list:
                scaled[n].get_batch(b, r)
            wall = time.perf_counter() - started
            worker_rates[n].append(64 * len(batch_list) / wall)
            loop_cores[n].append((time.process_time() - cpu_started) / wall)
        print(f"workers round {r + 1}: 1 worker {worker_rates[1][-1]:.0f}/s, 2 workers {worker_rates[2][-1]:.0f}/s "
              f"(the loop itself: {loop_cores[1][-1]:.2f} / {loop_cores[2][-1]:.2f} cores)", flush=True)
    for pool in pools.values():
        pool.close()

    refs = [n for n in rates if n in ("pillow", "tf.data")]
    best_other = {r: max(rates[n][r] for n in refs) for r in range(args.rounds)}
    best_cpu = {r: max(cpu_rates[n][r] for n in refs) for r in range(args.rounds)}
    result = {
        "images": count, "rounds": args.rounds, "load_avg_end": os.getloadavg(),
        "rates": rates, "median": {n: statistics.median(v) for n, v in rates.items()},
        "cpu_rates": cpu_rates, "median_per_cpu_second": {n: statistics.median(v) for n, v in cpu_rates.items()},
        "ratio_vs_best_reference": statistics.median(rates["hvdtrain"][r] / best_other[r] for r in range(args.rounds)),
        "ratio_vs_best_reference_cpu": statistics.median(cpu_rates["hvdtrain"][r] / best_cpu[r]
                                                         for r in range(args.rounds)),
        "worker_rates": worker_rates, "loop_cores": loop_cores,
        "two_vs_one_workers": statistics.median(worker_rates[2][r] / worker_rates[1][r] for r in range(args.rounds)),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("rates", "cpu_rates", "worker_rates")}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
