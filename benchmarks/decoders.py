"""JPEG decoder candidates for the image loader, in images per CPU-second, side by side and interleaved.

Every contender turns the same real-photo JPEGs (benchmarks/photo_tree.py, about 500x375) into
RandomResizedCrop 224 + flip uint8 arrays with the same per-sample crop boxes and flips (drawn by
hvdtrain's own transforms), one image at a time, in this process and one thread:

* ``hvdtrain``: :func:`hvdtrain.data.decode.decode`, the loader's own decode path as it is now;
* ``pillow``: plain Pillow, full decode, crop box given to ``resize`` (antialiased bilinear);
* ``pillow-draft``: Pillow with ``draft`` (DCT scaling 1/2, 1/4, 1/8 when the crop is at least
  twice the output) + crop-box ``resize``: hvdtrain's path before this benchmark;
* ``pillow-reduce``: Pillow full decode, ``reduce`` by the crop's whole factor, then crop-box ``resize``;
* ``simplejpeg-pil``: libjpeg-turbo N/8 DCT-scaled decode (``simplejpeg``) + Pillow crop-box resize;
* ``simplejpeg-cv2``: the same decode + OpenCV ``resize`` of the crop, INTER_LINEAR (SIMD);
* ``simplejpeg2-cv2``: simplejpeg limited to the SIMD scales (1/2, 1/4, 1/8; ``min_factor=2``) + OpenCV;
* ``simplejpeg2-cv2-exact``: the same with INTER_LINEAR_EXACT (OpenCV's bit-exact, platform-independent kernel);
* ``pillow-affine``: Pillow ``draft`` decode + Pillow's affine transform, bilinear at the output's
  pixel centres (not antialiased: the DCT scaling does the large reductions); ``simplejpeg2-affine``:
  simplejpeg's 1/2-1/4-1/8 decode + the same affine sampling;
* ``cv2``: ``cv2.imdecode`` (its bundled libjpeg-turbo; IMREAD_REDUCED_* when the crop allows) +
  ``cv2.resize`` INTER_LINEAR; ``cv2-area``: the same with INTER_AREA (antialiased box filter);
* ``cv2-hybrid``: INTER_AREA only where the decoded crop is larger than the output, else INTER_LINEAR;
* ``tf-eager``: ``tf.io.decode_and_crop_jpeg`` + ``tf.image.resize`` called eagerly per sample,
  as a decoding worker would; ``tf.data``: the same ops in a one-thread ``tf.data`` pipeline.

Images per CPU-second are the images over the user+sys time of this process (all its threads,
``time.process_time``), which the other load on a shared machine does not distort; wall-clock
images/s are printed beside them. Then the cost of each decoder's import in a fresh worker
process: seconds and resident memory.

    .venv/bin/python benchmarks/photo_tree.py /tmp/photos --train 50 --val 10
    .venv/bin/python benchmarks/decoders.py /tmp/photos --rounds 7 --json benchmarks/decoders.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import image_pipeline  # noqa: E402  (this folder is on sys.path when run as a script)
from hvdtrain.data.transforms import SampleOp, TransformPolicy  # noqa: E402

SIZE = 224
POLICY = TransformPolicy("imagenet", SIZE)


def photo_files(root: Path, count: int) -> list[Path]:
    """The first ``count`` JPEGs of ``root/train`` (sorted), spread over the classes."""
    files = sorted((root / "train").glob("*/*.JPEG"))
    step = max(1, len(files) // count)
    return files[::step][:count]


def flip(a: np.ndarray, f: bool) -> np.ndarray:
    """The same flip for every contender: OpenCV's (a copy of a reversed numpy view costs 25x more)."""
    import cv2

    return cv2.flip(np.ascontiguousarray(a), 1) if f else a


def pillow(data: bytes, crop, draft: bool = False, reduce: bool = False) -> np.ndarray:
    import io

    left, top, w, h, f = crop
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        factor = min(w, h) / SIZE
        if draft and factor >= 2:
            img.draft("RGB", (int(np.ceil(width / factor)), int(np.ceil(height / factor))))
        img = img.convert("RGB")
        sx, sy = img.size[0] / width, img.size[1] / height
        if reduce and factor >= 2:
            k = int(factor)
            img = img.reduce(k)
            sx, sy = sx / k, sy / k
        out = img.resize((SIZE, SIZE), Image.BILINEAR, box=(left * sx, top * sy, (left + w) * sx, (top + h) * sy))
    return flip(np.asarray(out), f)


def simplejpeg_decode(data: bytes, crop, min_factor: float = 1) -> tuple[np.ndarray, float, float]:
    import simplejpeg

    left, top, w, h, _ = crop
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    factor = min(w, h) / SIZE
    a = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=int(np.ceil(width / max(factor, 1))),
                               min_height=int(np.ceil(height / max(factor, 1))), min_factor=min_factor)
    return a, a.shape[1] / width, a.shape[0] / height


def cv2_resize(a: np.ndarray, crop, sx: float, sy: float, interpolation) -> np.ndarray:
    import cv2

    left, top, w, h, f = crop
    x0, y0 = int(round(left * sx)), int(round(top * sy))
    x1 = max(x0 + 1, min(a.shape[1], int(round((left + w) * sx))))
    y1 = max(y0 + 1, min(a.shape[0], int(round((top + h) * sy))))
    return flip(cv2.resize(a[y0:y1, x0:x1], (SIZE, SIZE), interpolation=interpolation), f)


def simplejpeg_pil(data: bytes, crop) -> np.ndarray:
    left, top, w, h, f = crop
    a, sx, sy = simplejpeg_decode(data, crop)
    out = Image.fromarray(a).resize((SIZE, SIZE), Image.BILINEAR, box=(left * sx, top * sy, (left + w) * sx,
                                                                       (top + h) * sy))
    return flip(np.asarray(out), f)


def simplejpeg_cv2(data: bytes, crop, min_factor: float = 1, exact: bool = False) -> np.ndarray:
    import cv2

    a, sx, sy = simplejpeg_decode(data, crop, min_factor)
    return cv2_resize(a, crop, sx, sy, cv2.INTER_LINEAR_EXACT if exact else cv2.INTER_LINEAR)


def affine(img: Image.Image, crop, sx: float, sy: float) -> np.ndarray:
    """Bilinear (not antialiased) sampling of the crop box at the output's pixel centres: Pillow's
    affine transform, the box in fractional decoded-pixel coordinates."""
    left, top, w, h, f = crop
    matrix = (w * sx / SIZE, 0, left * sx, 0, h * sy / SIZE, top * sy)
    return flip(np.asarray(img.transform((SIZE, SIZE), Image.AFFINE, matrix, resample=Image.BILINEAR)), f)


def pillow_affine(data: bytes, crop) -> np.ndarray:
    import io

    _, _, w, h, _ = crop
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        factor = min(w, h) / SIZE
        if factor >= 2:
            img.draft("RGB", (int(np.ceil(width / factor)), int(np.ceil(height / factor))))
        img = img.convert("RGB")
        return affine(img, crop, img.size[0] / width, img.size[1] / height)


def simplejpeg_affine(data: bytes, crop) -> np.ndarray:
    a, sx, sy = simplejpeg_decode(data, crop, min_factor=2)
    return affine(Image.fromarray(a), crop, sx, sy)


def opencv(data: bytes, crop, interpolation_name: str = "INTER_LINEAR") -> np.ndarray:
    """``interpolation_name`` "hybrid": INTER_AREA when the decoded crop is still larger than the output."""
    import cv2

    _, _, w, h, _ = crop
    factor = min(w, h) / SIZE
    flag = cv2.IMREAD_COLOR_RGB
    for k, reduced in ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2)):
        if factor >= k:
            flag = reduced
            break
    a = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if flag != cv2.IMREAD_COLOR_RGB:
        a = cv2.cvtColor(a, cv2.COLOR_BGR2RGB)
    header = Image.open(__import__("io").BytesIO(data)).size  # the full size (imdecode gives the reduced one)
    sx, sy = a.shape[1] / header[0], a.shape[0] / header[1]
    if interpolation_name == "hybrid":
        interpolation_name = "INTER_AREA" if min(w * sx, h * sy) > SIZE else "INTER_LINEAR"
    return cv2_resize(a, crop, sx, sy, getattr(cv2, interpolation_name))


def tf_eager(data: bytes, crop) -> np.ndarray:
    import tensorflow as tf

    left, top, w, h, f = crop
    image = tf.io.decode_and_crop_jpeg(data, [top, left, h, w], channels=3)
    image = tf.image.resize(image, (SIZE, SIZE), method="bilinear", antialias=False)
    return flip(tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8).numpy(), f)


def hvdtrain_decode(data: bytes, crop) -> np.ndarray:
    from hvdtrain.data.decode import decode

    left, top, w, h, f = crop
    return decode(data, POLICY, lambda _w, _h: SampleOp((left, top, w, h), f), grayscale=False)


def per_sample(fn):
    def run(blobs, boxes):
        for data, crop in zip(blobs, boxes):
            fn(data, crop)
    return run


def tf_data(paths, boxes):
    """The ``tf.data`` reference: the same pipeline as benchmarks/image_pipeline.py's (one thread)."""
    return image_pipeline.tf_pipeline(paths, boxes)


IMPORT_PROBE = ("import time; t = time.process_time(); {stmt}; s = time.process_time() - t; "
                "print(s, [int(line.split()[1]) / 1024 for line in open('/proc/self/status') if line.startswith('VmRSS')][0])")


def import_cost(stmt: str) -> tuple[float, float]:
    """CPU-seconds of ``stmt`` and resident memory (MB, VmRSS) after it, in a fresh Python process that
    has imported numpy (as a decoding worker has)."""
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(stmt="import numpy; " + stmt)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def contenders(skip_tf: bool) -> dict:
    """The contenders available here (a decoder whose module is not installed is left out, named)."""
    import cv2

    cv2.setNumThreads(1)
    out = {"hvdtrain": per_sample(hvdtrain_decode), "pillow": per_sample(pillow),
           "pillow-draft": per_sample(lambda d, c: pillow(d, c, draft=True)),
           "pillow-reduce": per_sample(lambda d, c: pillow(d, c, reduce=True)),
           "simplejpeg-pil": per_sample(simplejpeg_pil), "simplejpeg-cv2": per_sample(simplejpeg_cv2),
           "simplejpeg2-cv2": per_sample(lambda d, c: simplejpeg_cv2(d, c, min_factor=2)),
           "simplejpeg2-cv2-exact": per_sample(lambda d, c: simplejpeg_cv2(d, c, min_factor=2, exact=True)),
           "pillow-affine": per_sample(pillow_affine), "simplejpeg2-affine": per_sample(simplejpeg_affine),
           "cv2": per_sample(opencv), "cv2-area": per_sample(lambda d, c: opencv(d, c, "INTER_AREA")),
           "cv2-hybrid": per_sample(lambda d, c: opencv(d, c, "hybrid"))}
    if not skip_tf:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        out["tf-eager"] = per_sample(tf_eager)
        out["tf.data"] = "tf.data"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="photo tree (benchmarks/photo_tree.py)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--images", type=int, default=300, help="images per contender per round")
    parser.add_argument("--only", default=None, help="comma-separated contenders (default: all)")
    parser.add_argument("--skip-tf", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    paths = photo_files(Path(args.root), args.images)
    boxes = image_pipeline.boxes(paths, seed=1)  # the same crops as the loader benchmark's
    blobs = [p.read_bytes() for p in paths]
    runs = contenders(args.skip_tf)
    if "tf.data" in runs:
        runs["tf.data"] = tf_data(paths, boxes)
    if args.only:
        runs = {n: runs[n] for n in args.only.split(",")}
    for fn in runs.values():  # warm up: code paths, tf.data's tracing
        fn(blobs[:16], boxes[:16])
    cpu: dict[str, list[float]] = {n: [] for n in runs}
    wall: dict[str, list[float]] = {n: [] for n in runs}
    for r in range(args.rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            started, cpu_started = time.perf_counter(), time.process_time()
            runs[name](blobs, boxes)
            cpu[name].append(len(blobs) / (time.process_time() - cpu_started))
            wall[name].append(len(blobs) / (time.perf_counter() - started))
        print(f"round {r + 1}: " + ", ".join(f"{n} {cpu[n][-1]:.0f}" for n in runs) + " images/cpu-s", flush=True)
    median = {n: statistics.median(v) for n, v in cpu.items()}
    refs = [n for n in ("pillow", "tf.data") if n in runs]
    ratios = {}
    if refs:  # per round against the best reference of that round, then the median
        ratios = {n: statistics.median(cpu[n][r] / max(cpu[ref][r] for ref in refs) for r in range(args.rounds))
                  for n in runs}
    imports = {"pillow": "import PIL.Image", "simplejpeg+cv2": "import simplejpeg, cv2",
               "cv2": "import cv2", "tensorflow": "import tensorflow"}
    costs = {name: import_cost(stmt) for name, stmt in imports.items()}
    result = {"images": len(blobs), "rounds": args.rounds, "images_per_cpu_second": cpu, "images_per_second": wall,
              "median_per_cpu_second": median, "ratio_vs_best_reference_cpu": ratios,
              "import_cpu_seconds_and_rss_mb": costs, "load_avg_end": os.getloadavg()}
    print(json.dumps({k: v for k, v in result.items() if k not in ("images_per_cpu_second", "images_per_second")},
                     indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
