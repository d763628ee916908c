"""Model folders and files from elsewhere, and the exports the recipes write: what is read runs no
code of the file's and fails in one line naming it; what is written is whole or absent.

* :func:`from_pretrained`: a Hugging Face folder (``--model DIR``, an export read by ``hvdtrain
  predict``) through ``transformers``' ``from_pretrained`` with ``trust_remote_code=False``; a folder
  whose ``config.json`` (or tokenizer/preprocessor config) has an ``auto_map`` (its own Python code)
  is refused before transformers sees it, so no prompt is ever shown and no code of it runs; weights
  that fail to load (a pickled ``pytorch_model.bin``: ``torch.load(weights_only=True)`` refuses it)
  are one :class:`ModelFileError` line naming the folder.
* :func:`load_keras`: a ``model.keras`` in Keras's safe mode; one line naming the file when it
  names something Keras will not build (``os.system`` as a layer) or does not load.
* :func:`export_errors`: an export that cannot be written (a full disk) is one line naming it; the
  writing itself is :func:`hvdtrain.core.durable.publish_folder` (fsynced, renamed into place,
  the temporary folder removed on failure).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

CODE_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                "image_processor_config.json", "feature_extractor_config.json")


class ModelFileError(ValueError):
    """A model folder or file cannot be used as it is; the message names it and says why."""


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def check_no_remote_code(folder: str | Path) -> None:
    """Refuse a Hugging Face folder that asks to run its own code (an ``auto_map`` in any of its
    configs), naming the folder and the file; never prompts."""
    folder = Path(folder)
    for name in CODE_CONFIGS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"{path} is not readable JSON ({_first_line(exc)})") from None
        if isinstance(config, dict) and config.get("auto_map"):
            raise ModelFileError(f"model folder {folder} asks to run its own code ({name} has an auto_map naming "
                                 f"{', '.join(sorted(map(str, config['auto_map'])))[:120]}); hvdtrain never runs code "
                                 f"from a model folder: use a model of an architecture transformers has")


def from_pretrained(auto_class: Any, folder: str | Path, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(folder, trust_remote_code=False, **kwargs)`` after
    :func:`check_no_remote_code`; a folder whose weights or config do not load is one
    :class:`ModelFileError` line naming it (``ValueError`` for an architecture transformers has no
    class for is left to the caller, which knows what to say)."""
    import pickle

    check_no_remote_code(folder)
    try:
        return auto_class.from_pretrained(folder, trust_remote_code=False, **kwargs)
    except (pickle.UnpicklingError, OSError, EOFError) as exc:  # a pickled .bin refused, a truncated file
        if isinstance(exc, pickle.UnpicklingError):
            from hvdtrain.torch.weights import refusal

            detail = f"pickled objects besides tensors: {refusal(exc)}"
        else:
            detail = _first_line(exc)
        raise ModelFileError(f"cannot load the model in {folder}: its weights are not a weights-only file "
                             f"transformers reads ({detail}); nothing of it ran") from None


def load_keras(path: str | Path, **kwargs: Any) -> Any:
    """``keras.saving.load_model(path, compile=False, safe_mode=True, **kwargs)``; a file Keras
    refuses or cannot read is one :class:`ModelFileError` line naming it."""
    import keras

    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True, **kwargs)
    except (TypeError, ValueError, KeyError, AttributeError, OSError, ImportError) as exc:
        raise ModelFileError(f"{path} is not a Keras model hvdtrain can load ({_first_line(exc)}); nothing "
                             f"of it ran") from None


def _write_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError,)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:
        pass
    return errors


@contextlib.contextmanager
def export_errors(target: str | Path) -> Iterator[None]:
    """An export of ``target`` that fails to write (full disk, read-only folder; safetensors'
    own error for them) becomes one :class:`ModelFileError` line naming it."""
    try:
        yield
    except _write_errors() as exc:
        raise ModelFileError(f"cannot write the export {target} ({_first_line(exc)}); nothing was replaced and the "
                             f"run's checkpoints are intact") from None
