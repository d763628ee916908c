"""TensorFlow checkpoint files: model and optimizer variables as NumPy ``.npz`` files, in order,
with their paths, written one variable at a time and read back checked (count, shapes, paths
beyond Keras's automatic numbering). No pickled object is written or read; every member's header
is checked before any array is read (:mod:`hvdtrain.core.npz`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.npz import open_npz

MODEL_FILE = "model_variables.npz"  # every model variable, dropout seed state included
OPTIMIZER_FILE = "optimizer.npz"  # loss-scale state included (train.mixed_precision=fp16)


def save_variables(path: Path, variables: list[Any]) -> None:
    """Variables in order, as a NumPy .npz (no pickled objects), with their paths for checking:
    ``np.savez``'s file (``v00000.npy``... then ``paths.npy``, stored, zip64), written one variable
    at a time, so that one variable's host copy exists at a time (``np.savez`` takes them all at
    once: a copy of the whole model, or on a sharded run's rank 0 of the whole optimizer state)."""
    paths = np.asarray([getattr(v, "path", v.name) for v in variables], dtype=np.str_)
    with open(path, "wb") as f, zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                                                 allowZip64=True) as archive:
        for name, value in [*((f"v{i:05d}", v) for i, v in enumerate(variables)), ("paths", paths)]:
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:  # as np.savez writes it
                np.lib.format.write_array(member, np.asarray(value if name == "paths" else value.numpy()),
                                          allow_pickle=False)


def _variable_path(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def canonical_paths(paths: list[str]) -> list[str]:
    """Variable paths with Keras's automatic numbering made relative: Keras names layers, seed
    generators and optimizers ``dense``, ``dense_1``, ... by a per-process counter, so the same
    model built after another one is ``sequential_1/dense_2/kernel`` (and its momentum
    ``sgd_1/sequential_1_dense_2_kernel_momentum``). In each path component, every word's numeric
    suffix (none counts as 0) is replaced by its rank among the suffixes that word carries at that
    place of components of the same words in ``paths``; a renamed, added, removed or reordered
    variable still differs."""
    split = []
    suffixes: dict[tuple[str, int], set[int]] = {}
    for path in paths:
        components = []
        for component in path.split("/"):
            words: list[list] = []
            for part in component.split("_"):
                if part.isdigit() and words and words[-1][1] is None:
                    words[-1][1] = int(part)
                else:
                    words.append([part, None])
            base = "_".join(word for word, _ in words)
            numbered = [(word, (base, i), n or 0) for i, (word, n) in enumerate(words)]
            for _, key, n in numbered:
                suffixes.setdefault(key, set()).add(n)
            components.append(numbered)
        split.append(components)
    rank = {key: {n: i for i, n in enumerate(sorted(ns))} for key, ns in suffixes.items()}
    return ["/".join("_".join(f"{word}#{rank[key][n]}" for word, key, n in component) for component in components)
            for components in split]


def check_paths(path: Path, saved: Any, variables: list[Any]) -> None:
    """Refuse (ValueError naming the first difference, saved vs now) when the variable paths stored
    in ``saved`` (an open :func:`save_variables` file at ``path``) are not ``variables``' paths,
    beyond Keras's automatic numbering (:func:`canonical_paths`). A file without paths passes."""
    if "paths" not in saved.files:
        return
    saved_paths = [str(p) for p in saved["paths"]]
    now_paths = [_variable_path(v) for v in variables]
    for i, (was, now) in enumerate(zip(canonical_paths(saved_paths), canonical_paths(now_paths))):
        if was != now:
            raise ValueError(f"{path}: variable {i} was saved as {saved_paths[i]!r}, this model's is "
                             f"{now_paths[i]!r}: the model or the library changed; refusing to load "
                             f"the checkpoint by position (nothing was loaded)")


def read_variables(path: Path, variables: list[Any]) -> list[np.ndarray]:
    """The values :func:`save_variables` wrote for ``variables``, read only after the file's headers
    are checked (:func:`hvdtrain.core.npz.open_npz`: a member declaring more than the file holds, a
    compressed or pickled member is a CheckpointError naming file and member, before any array is
    read) and after the count, the paths and every member's declared shape match ``variables``
    (ValueError naming the first difference; values are stored by position: a variable whose saved
    path differs from this model's, beyond Keras's automatic numbering, would be loaded into the
    wrong place)."""
    with open_npz(path) as saved:
        names = sorted(n for n in saved.files if n != "paths")
        if len(names) != len(variables):
            raise ValueError(f"{path} holds {len(names)} variables, this model/optimizer has {len(variables)}")
        check_paths(path, saved, variables)
        for name, variable in zip(names, variables):
            shape = saved.members[name].shape  # from the header: nothing is read before every shape matches
            if shape != tuple(variable.shape):
                raise ValueError(f"{path}: variable {getattr(variable, 'path', name)} has shape "
                                 f"{tuple(variable.shape)}, the checkpoint has {shape}")
        return [saved[name] for name in names]


def load_variables(path: Path, variables: list[Any]) -> None:
    """Assign what :func:`save_variables` wrote, checked by :func:`read_variables` before anything
    is assigned (a count, path or shape mismatch is a clear error; nothing is loaded then)."""
    for variable, value in zip(variables, read_variables(path, variables)):
        variable.assign(value)
