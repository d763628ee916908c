"""Where a split's images are: the layout of a dataset root (detected or named) and its shard files or URLs.

:func:`open_indexes` turns a root (a local folder, a URL, or None when the shard patterns are URLs
or paths themselves) and :class:`~hvdtrain.data.options.ImageOptions` into the train and
validation indexes:

* ``folder``: ``root/train/<class>/*`` and ``root/val/<class>/*`` (the same class folders), or a
  flat ``root/val`` with a labels CSV (``val_labels``): :func:`hvdtrain.data.index.load_index`;
* ``webdataset``, ``parquet``, ``arrow``: shards named by ``train_shards``/``val_shards`` (brace
  patterns, globs or folders, relative to the root or absolute) or found in the format's usual
  places (:func:`find_shards`); remote shards (URLs) by pattern or from the ``manifest.json`` that
  ``hvdtrain convert`` wrote (:func:`find_remote_shards`): :func:`hvdtrain.data.shards.load_shard_index`.

``format="auto"`` is detected from the root (:func:`detect_format`) or from the extension of
``train_shards``. Errors are one :class:`~hvdtrain.data.errors.DataError` line naming the folder,
pattern or key and what would do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvdtrain.data import braces, remote
from hvdtrain.data.errors import DataError
from hvdtrain.data.index import ImageIndex, load_index
from hvdtrain.data.shards import EXTENSIONS, load_shard_index

VAL_SPLITS = ("val", "validation", "test")


def _arrow_split(root: Path, split: str) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` split folder, in ``state.json``'s order."""
    state = root / split / "state.json"
    if state.is_file():
        try:
            files = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{state} is not a datasets save_to_disk state file: {exc}") from None
        return [root / split / f for f in files]
    return sorted((root / split).glob("*.arrow"))


def _candidates(root: Path, fmt: str, split: str) -> list[list[Path]]:
    """Where ``fmt``'s shards of ``split`` usually are (each a list of files, maybe empty)."""
    if fmt == "webdataset":
        return [sorted((root / split).glob("*.tar")), sorted(root.glob(f"*{split}*.tar"))]
    if fmt == "parquet":
        return [sorted((root / "data").glob(f"{split}-*.parquet")), sorted((root / split).glob("*.parquet")),
                sorted(root.glob(f"{split}-*.parquet"))]
    return [_arrow_split(root, split)]


def detect_format(root: Path) -> str:
    """``folder``, ``webdataset``, ``parquet`` or ``arrow``, from the layout of ``root``."""
    if (root / "dataset_dict.json").is_file() or (root / "train" / "state.json").is_file():
        return "arrow"
    for fmt in ("parquet", "webdataset"):
        if any(_candidates(root, fmt, "train")):
            return fmt
    if (root / "train").is_dir():
        return "folder"
    raise DataError(f"{root} holds no dataset layout hvdtrain knows (train/ + val/ class folders, train/*.tar or "
                    f"*train*.tar, data/train-*.parquet or train/*.parquet, a save_to_disk folder); it holds: "
                    f"{braces.listing(str(root))}; or set image.format and image.train_shards")


def _format_of(root: Path, pattern: str) -> str:
    """The format of the shards ``pattern`` names (by extension; a folder by what it holds)."""
    path = Path(pattern) if Path(pattern).is_absolute() else root / pattern
    names = [p.name for p in path.iterdir()] if path.is_dir() else [path.name]
    for fmt, extensions in EXTENSIONS.items():
        if any(n.lower().endswith(extensions) for n in names):
            return fmt
    raise DataError(f"image.train_shards={pattern}: cannot tell the format from the names (.tar, .parquet or "
                    f".arrow); set image.format")


def _remote_format(pattern: str, key: str) -> str:
    """The format of remote shards, from the pattern's extension."""
    for fmt, extensions in EXTENSIONS.items():
        if pattern.lower().rstrip("/").endswith(extensions):
            return fmt
    raise DataError(f"{key}={pattern}: cannot tell the format from the name (.tar, .parquet or .arrow); "
                    f"set image.format")


def remote_manifest(root: str | None) -> dict | None:
    """The ``manifest.json`` of ``hvdtrain convert`` at the URL ``root`` (None if there is none)."""
    if root is None:
        return None
    url = remote.join(root, "manifest.json")
    data = remote.read_small(url, "manifest")  # bounded: remote.MANIFEST_BYTES
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise DataError(f"{url} is not a JSON manifest: {exc}") from None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("splits"), dict) else None


def find_remote_shards(root: str | None, pattern: str | None, fmt: str, key: str,
                       manifest: dict | None = None, splits: tuple[str, ...] = ()) -> list[str]:
    """The URLs of a split's remote shards: ``pattern`` (a brace pattern, relative to the URL
    ``root`` or a URL itself), else the first of ``splits`` that ``hvdtrain convert``'s manifest at
    ``root`` lists (a plain HTTP server cannot be listed)."""
    if not pattern:
        for split in splits if manifest else ():
            entry = manifest["splits"].get(split)
            if isinstance(entry, dict) and entry.get("shards"):
                return [remote.join(root, str(shard["name"])) for shard in entry["shards"]]
        raise DataError(f"{key} is not set: remote data ({root}) cannot be searched for its shards and has no "
                        f"manifest.json of hvdtrain convert listing a {'/'.join(splits) or 'split'} split; name "
                        f"them with a brace pattern such as {key}=train/train-{{000000..000099}}.tar")
    url = pattern if remote.is_url(pattern) or root is None else remote.join(root, pattern)
    if not remote.is_url(url):
        raise DataError(f"{key}={pattern} is a local path but the other split is remote ({root}); give URLs")
    return remote.expand(url, EXTENSIONS[fmt])


def find_shards(root: Path, fmt: str, pattern: str | None, splits: tuple[str, ...], key: str) -> list[Path]:
    """The shard files of a split: ``pattern`` (brace pattern, glob or folder, relative to ``root``)
    or the first of ``splits`` found in ``fmt``'s usual places."""
    if pattern:
        if fmt == "arrow" and (Path(pattern) if Path(pattern).is_absolute() else root / pattern).is_dir():
            folder = Path(pattern) if Path(pattern).is_absolute() else root / pattern
            files = _arrow_split(folder.parent, folder.name)
            if files:
                return files
        try:
            return braces.resolve(pattern, root, EXTENSIONS[fmt])
        except FileNotFoundError as exc:
            raise DataError(f"{key}={pattern}: {exc}") from None
    for split in splits:
        for files in _candidates(root, fmt, split):
            if files:
                return files
    raise DataError(f"no {fmt} shards of the {'/'.join(splits)} split in {root} (looked for "
                    f"{_places(fmt, splits[0])}); it holds: {braces.listing(str(root))}; set {key}")


def _places(fmt: str, split: str) -> str:
    return {"webdataset": f"{split}/*.tar, *{split}*.tar",
            "parquet": f"data/{split}-*.parquet, {split}/*.parquet, {split}-*.parquet",
            "arrow": f"{split}/state.json + {split}/*.arrow"}[fmt]


def is_remote(root: str | Path | None, options: Any) -> bool:
    """True when the root or ``options.train_shards`` is a URL (shards read through fsspec)."""
    return any(x is not None and remote.is_url(str(x)) for x in (root, options.train_shards))


def _remote_indexes(root: str | None, options: Any) -> tuple[ImageIndex, ImageIndex, str]:
    """The train and val indexes of remote shards: ``train_shards``/``val_shards`` (under the URL
    ``root``), or the splits listed by the ``manifest.json`` that ``hvdtrain convert`` wrote there."""
    url_root = str(root) if root is not None and remote.is_url(str(root)) else None
    if options.format == "folder":
        raise DataError(f"image.format=folder: an ImageFolder tree is read from a local folder, not {root}; "
                        f"store it as shards (hvdtrain convert) to read it remotely")
    manifest = remote_manifest(url_root) if not (options.train_shards and options.val_shards) else None
    fmt = options.format
    if fmt == "auto" and options.train_shards:
        fmt = _remote_format(options.train_shards, "image.train_shards")
    elif fmt == "auto":  # from the manifest (none: find_remote_shards says what to set)
        fmt = manifest.get("format") if manifest and manifest.get("format") in EXTENSIONS else "webdataset"
    columns = dict(image_column=options.image_column, label_column=options.label_column, cache=options.index_cache)
    train = load_shard_index(find_remote_shards(url_root, options.train_shards, fmt, "image.train_shards", manifest,
                                                ("train",)), fmt, **columns)
    val_files = find_remote_shards(url_root, options.val_shards, fmt, "image.val_shards", manifest, VAL_SPLITS)
    return train, load_shard_index(val_files, fmt, classes=train.classes, **columns), fmt


def _folder_indexes(root: Path, options: Any) -> tuple[ImageIndex, ImageIndex]:
    """The two splits of an ImageFolder tree (``val`` flat with ``options.val_labels``)."""
    train = load_index(root / "train", cache=options.index_cache)
    val = load_index(root / "val", labels_file=options.val_labels,
                     classes=train.classes if options.val_labels else None, cache=options.index_cache)
    if val.classes != train.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise DataError(f"class folders differ between {root / 'train'} and {root / 'val'}: "
                        f"only in train: {only_train or 'none'}; only in val: {only_val or 'none'}")
    return train, val


def open_indexes(root: str | Path | None, options: Any) -> tuple[ImageIndex, ImageIndex, str]:
    """The train and val indexes of ``root`` under ``options`` (an
    :class:`~hvdtrain.data.options.ImageOptions`) and the format they are stored in. ``root`` None:
    the shard patterns locate the data themselves (URLs, or paths relative to the current folder)."""
    if is_remote(root, options):
        return _remote_indexes(None if root is None else str(root), options)
    if root is None and not options.train_shards:
        raise DataError("no image data given: name its folder or URL (--data), or its shards (image.train_shards)")
    if root is None and options.format == "folder":
        raise DataError("image.format=folder: an ImageFolder tree needs its folder (--data)")
    root = Path.cwd() if root is None else Path(root)
    if not root.is_dir() and not (options.format != "folder" and options.train_shards):
        raise DataError(f"data directory {root} does not exist")
    fmt = options.format if options.format != "auto" else (
        _format_of(root, options.train_shards) if options.train_shards else detect_format(root))
    if fmt == "folder":
        return (*_folder_indexes(root, options), fmt)
    columns = dict(image_column=options.image_column, label_column=options.label_column, cache=options.index_cache)
    train = load_shard_index(find_shards(root, fmt, options.train_shards, ("train",), "image.train_shards"), fmt,
                             **columns)
    val_files = find_shards(root, fmt, options.val_shards, VAL_SPLITS, "image.val_shards")
    return train, load_shard_index(val_files, fmt, classes=train.classes, **columns), fmt
