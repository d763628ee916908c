"""One call from where image data is to the datasets the training loop reads: :func:`open_images`.

It reads the layout (:mod:`hvdtrain.data.layouts`: an ImageFolder tree, a flat validation folder
with a labels CSV, WebDataset tars, Parquet, Arrow; local or remote), loads each split's cached
index, chooses the transform policy from the training images' headers
(:func:`hvdtrain.data.transforms.choose_policy`), starts the decoding workers
(:mod:`hvdtrain.data.workers`), and, for shards read in streaming mode, opens each split's
stream (:mod:`hvdtrain.data.stream`). What it returns, :class:`ImageData`, holds the train and
validation :class:`~hvdtrain.data.pipeline.ImageDataset` (``get_batch(indices, epoch)`` -> uint8
NHWC images and int64 labels) and the class names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdtrain.data import remote
from hvdtrain.data.errors import DataError
from hvdtrain.data.index import ImageIndex
from hvdtrain.data.layouts import open_indexes
from hvdtrain.data.options import FORMATS, ImageOptions
from hvdtrain.data.pipeline import ImageDataset
from hvdtrain.data.transforms import choose_policy

_POOLS: dict[int, Any] = {}


@dataclass
class ImageData:
    """What :func:`open_images` opened: the two splits, the class names (label ``i`` is
    ``classes[i]``, the training split's numbering), the storage format (``folder``,
    ``webdataset``, ``parquet`` or ``arrow``) and the decoding processes per rank (0: in the
    training process)."""

    train: ImageDataset
    val: ImageDataset
    classes: list[str]
    format: str
    workers: int

    def describe(self) -> str:
        """One line for the start-up log: files, classes, index, image shape, transform, workers, streaming."""
        train, index = self.train, self.train.index
        line = (f"{len(index):,} train / {len(self.val.index):,} val files in {len(self.classes)} classes "
                f"(index {'built' if index.built else 'cached'}: {index.nbytes / 2**20:.1f} MiB); "
                f"{train.policy.size}x{train.policy.size}x{train.channels}, {train.policy.kind}: "
                f"{train.policy.describe()}; {self.workers or 'no'} decoding worker(s) per rank")
        if train.stream is not None:
            spool = train.stream.spool
            line += (f"; streamed from {index.root} in {train.stream.plan.lanes} lane(s), spool of up to "
                     f"{spool.max_shards} shards / {spool.max_bytes >> 20} MiB per rank")
        return line


def default_workers(local_size: int) -> int:
    """The cores each local rank can have (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_size))


def decoding_pool(workers: int):
    """This process's pool of ``workers`` decoding processes (one per count, started on first use,
    from the calling thread: call it from the main thread)."""
    if workers not in _POOLS:
        from hvdtrain.data.workers import WorkerPool

        _POOLS[workers] = WorkerPool(workers)
    return _POOLS[workers]


def _subset(count: int, limit: int | None, seed: int) -> np.ndarray | None:
    """A seeded random subset of ``limit`` of ``count`` samples (sorted), or None for all."""
    if limit is None or limit >= count:
        return None
    return np.sort(np.random.default_rng([seed, 7919]).permutation(count)[:limit])


def read_mode(index: ImageIndex, options: ImageOptions) -> str:
    """``random`` or ``stream`` for ``index`` under ``options.read`` (auto: stream remote shards)."""
    if options.read == "auto":
        return "stream" if index.where is not None and remote.is_url(str(index.root)) else "random"
    return options.read


def _stream(index: ImageIndex, rows, options: ImageOptions, *, seed: int, shuffle: bool, train: bool,
            world_size: int):
    """The :class:`~hvdtrain.data.stream.Stream` of a split in streaming mode, or None."""
    if read_mode(index, options) != "stream":
        return None
    from hvdtrain.data.stream import open_stream

    return open_stream(index, rows, lanes=options.stream_lanes or world_size, seed=seed, shuffle=shuffle, train=train,
                       max_bytes=options.spool_mb << 20, max_shards=options.spool_shards, spool_dir=options.spool_dir)


def _check(options: ImageOptions) -> None:
    """The choices a direct caller can get wrong (a config section is checked when it is loaded)."""
    for key, allowed in (("format", FORMATS), ("read", remote.READ_MODES), ("bad_files", ("error", "skip"))):
        value = getattr(options, key)
        if value not in allowed:
            raise DataError(f"image.{key}={value!r} is not one of {', '.join(allowed)}")


def open_images(root: str | os.PathLike | None, options: ImageOptions | None = None, *, seed: int = 0,
                max_train: int | None = None, max_val: int | None = None, shuffle: bool = True,
                world_size: int = 1, local_size: int = 1, elastic: bool = False, pool: Any = None) -> ImageData:
    """Open the image data at ``root`` and return its train and validation datasets and classes.

    ``root``, the layouts (``options.format="auto"`` detects them from what ``root`` holds):

    * ``folder``: ``root/train/<class>/*`` and ``root/val/<class>/*`` with the same class
      folders, or a flat ``root/val`` whose labels are in ``options.val_labels`` (ImageNet's
      ``LOC_val_solution.csv`` or ``file,class`` rows);
    * ``webdataset``: ``<key>.jpg|png|...`` + ``<key>.cls|.json`` tars (``train/*.tar`` or ``*train*.tar``);
    * ``parquet``: the Hugging Face Hub's (``data/train-*.parquet`` or ``train/*.parquet``), an
      image ``struct{bytes, path}`` or binary column and a label column;
    * ``arrow``: a ``datasets`` ``save_to_disk`` folder.

    The validation split is ``val``, else ``validation``, else ``test``. Shards may be named
    instead (``options.train_shards``/``val_shards``: brace patterns, globs or folders, relative
    to ``root`` or absolute), and may be remote: ``root`` or the patterns as URLs (``https://``,
    ``s3://``, through fsspec; a folder that ``hvdtrain convert`` wrote needs only its URL).
    ``root`` None: the patterns locate the shards (URLs, or paths relative to the current folder).
    Remote shards are streamed (``options.read="auto"``), local ones read at random.

    ``options``: an :class:`~hvdtrain.data.options.ImageOptions` (None: its defaults), the same
    keys as a recipe's ``image`` section: transform policy and size, decoding workers, bad files,
    index cache, columns, streaming lanes and spool. The run's settings: ``seed`` (transforms,
    subsets, the streaming order), ``max_train``/``max_val`` (a seeded random subset),
    ``shuffle`` (the training loop's ``data.shuffle``), ``world_size`` (default streaming
    lanes), ``local_size`` (ranks on this host: ``options.workers`` None gives each the cores it
    can have), ``elastic`` (a world size that may change: streaming then needs
    ``options.stream_lanes``). ``pool``: a :class:`~hvdtrain.data.workers.WorkerPool` to decode
    in, used as given and left open (None: ``options.workers`` processes, started once per
    process and count).

    No image is decoded here (the headers of a sample of the training images choose the colour
    mode, the native size and so the transform policy); the indexes are built once per host and
    cached. Bad input (an unknown layout, a folder or shard that does not exist, classes that
    differ between the splits, a remote folder with no shard list) raises
    :class:`~hvdtrain.data.errors.DataError`, one line naming it (the command line prints it with a
    URL's password hidden, :func:`hvdtrain.core.redact.redact_text`).
    """
    options = ImageOptions() if options is None else options
    _check(options)
    train_index, val_index, fmt = open_indexes(root, options)
    if elastic and options.stream_lanes is None and read_mode(train_index, options) == "stream":
        raise DataError("train.elastic=true streams the shards (image.read): set image.stream_lanes (for example to "
                        "the largest world size) so the streaming order stays the same when workers come and go")
    grayscale = train_index.grayscale  # the validation images are converted to the training images' mode
    policy = choose_policy(options.transform, options.size, train_index.native_size, options.augment, grayscale)
    if pool is None:
        workers = default_workers(local_size) if options.workers is None else options.workers
        pool = decoding_pool(workers) if workers > 0 else None
    common = dict(seed=seed, bad_files=options.bad_files, pool=pool, grayscale=grayscale)
    streaming = dict(seed=seed, shuffle=shuffle, world_size=world_size)
    rows = _subset(len(train_index), max_train, seed)
    train = ImageDataset(train_index, policy, train=True, rows=rows, name="train",
                         stream=_stream(train_index, rows, options, train=True, **streaming), **common)
    rows = _subset(len(val_index), max_val, seed + 1)
    val = ImageDataset(val_index, policy, train=False, rows=rows, name="val",
                       stream=_stream(val_index, rows, options, train=False, **streaming), **common)
    return ImageData(train, val, list(train_index.classes), fmt, pool.num_workers if pool is not None else 0)
