"""torchvision-layout ResNet weights (``.pth`` state dict or ``.safetensors``) into hvdtrain's ResNets.

torchvision names a ResNet's tensors ``conv1.weight``, ``bn1.{weight,bias,running_mean,running_var,
num_batches_tracked}``, ``layer<i>.<j>.conv<k>.weight``, ``layer<i>.<j>.bn<k>.*``,
``layer<i>.<j>.downsample.{0,1}.*`` and ``fc.{weight,bias}``. :func:`load_torchvision_resnet`
maps them onto :class:`~hvdtrain_recipes.image_classification.torch_models.ResNet` (``stem``, ``stages``,
``head``) or onto the Keras ResNet of :mod:`~hvdtrain_recipes.image_classification.keras_models` (by its
``torchvision_layers``; convolution kernels OIHW -> HWIO, dense kernels transposed, BatchNorm
weight/bias/running stats -> gamma/beta/moving stats), so the same file gives the same logits in
both frameworks.

Checked before anything is assigned: a missing key, an unexpected key or a shape that differs
stops with a :class:`~hvdtrain.ConfigError` naming the keys. The one exception is the final ``fc``
when only its class count differs from the model's: it is skipped (the head keeps its fresh
initialisation) and a note says so. A ``.pth`` never runs code: torch reads it with
``torch.load(weights_only=True)``, the TensorFlow side with an allow-listed unpickler of its own
(:mod:`~hvdtrain_recipes.image_classification.torch_pickle`: no torch needed, as for ``.safetensors``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain import ConfigError

SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
BN_STATS = ("weight", "bias", "running_mean", "running_var")
OPTIONAL = "num_batches_tracked"  # torch BatchNorm's counter: absent from old files, unused by Keras
_BODY = {0: "conv1", 1: "bn1", 3: "conv2", 4: "bn2", 6: "conv3", 7: "bn3"}  # torch_models' block.body indices
_KERAS_BN = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}


def read_state_dict(path: str | Path, framework: str = "torch") -> dict[str, np.ndarray]:
    """The tensors of a torchvision-layout weights file as NumPy arrays, keyed by name (a
    ``{"state_dict": ...}`` or ``{"model": ...}`` wrapper and a DDP ``module.`` prefix are removed).
    A ``.pth`` is read by ``torch.load(weights_only=True)`` for ``framework`` torch, by
    :mod:`~hvdtrain_recipes.image_classification.torch_pickle` (no torch) for tensorflow."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model.pretrained: {path} is not a file")
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        try:
            state: Any = load_file(str(path))
        except Exception as exc:  # a corrupt or foreign file: the reader's own words
            raise ConfigError(f"model.pretrained: {path} is not a readable .safetensors file ({exc})") from None
    elif path.suffix in SUFFIXES and framework != "torch":
        from hvdtrain_recipes.image_classification import torch_pickle

        try:
            state = _unwrap(torch_pickle.load(path), path)
        except torch_pickle.NotWeightsError as exc:
            raise ConfigError(f"model.pretrained: {path} is not a weights-only torch state dict ({exc})") from None
        state = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
    elif path.suffix in SUFFIXES:
        try:
            import torch
        except ImportError:
            raise ConfigError(f"model.pretrained: reading {path} (a torch pickle) needs torch installed; "
                              "install it, or convert the file to .safetensors") from None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: no code runs
        except Exception as exc:  # torch's own message spans many lines: its first says what
            raise ConfigError(f"model.pretrained: {path} is not a weights-only torch state dict "
                              f"({(str(exc).strip().splitlines() or [type(exc).__name__])[0]})") from None
        state = {k: v.detach().float().numpy() if v.is_floating_point() else v.detach().numpy()
                 for k, v in _unwrap(state, path).items() if isinstance(v, torch.Tensor)}
    else:
        raise ConfigError(f"model.pretrained: {path} has suffix {path.suffix!r}; allowed: {', '.join(SUFFIXES)}")
    return {k[len("module."):] if k.startswith("module.") else k: np.asarray(v) for k, v in state.items()}


def _unwrap(state: Any, path: Path) -> dict:
    """The state dict inside a ``{"state_dict": ...}`` or ``{"model": ...}`` checkpoint."""
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict) and len(state) <= 3:
            state = state[wrapper]
    if not isinstance(state, dict):
        raise ConfigError(f"model.pretrained: {path} holds a {type(state).__name__}, not a state dict")
    return state


def architecture(state: dict[str, Any]) -> str | None:
    """Which torchvision ResNet a state dict's keys describe (``resnet50``), or None."""
    blocks = [1 + max((int(m.group(2)) for m in map(re.compile(r"layer(\d)\.(\d+)\.").match, state)
                       if m and m.group(1) == str(i)), default=-1) for i in range(1, 5)]
    bottleneck = any(".conv3." in k for k in state)
    known = {((2, 2, 2, 2), False): "resnet18", ((3, 4, 6, 3), False): "resnet34",
             ((3, 4, 6, 3), True): "resnet50", ((3, 4, 23, 3), True): "resnet101"}
    return known.get((tuple(blocks), bottleneck))


def torch_names(model: Any) -> dict[str, str]:
    """torchvision's name of each tensor of an hvdtrain torch ResNet's state dict -> its own key."""
    stage_of = []
    for i, count in enumerate(model.blocks_per_stage):
        stage_of += [(i + 1, j) for j in range(count)]
    names = {}
    for key in model.state_dict():
        parts = key.split(".")
        if parts[0] == "stem":
            tv = {"0": "conv1", "1": "bn1"}[parts[1]] + "." + parts[2]
        elif parts[0] == "stages":
            i, j = stage_of[int(parts[1])]
            module = _BODY[int(parts[3])] if parts[2] == "body" else f"downsample.{parts[3]}"
            tv = f"layer{i}.{j}.{module}.{parts[4]}"
        elif parts[0] == "head":
            tv = "fc." + parts[-1]
        else:
            raise ValueError(f"unexpected key {key!r} in {type(model).__name__}")
        names[tv] = key
    return names


def _keras_variables(layer: Any, module: str) -> dict[str, Any]:
    """torchvision tensor suffix -> the Keras variable, for one mapped layer."""
    if module == "fc":
        return {"weight": layer.kernel, "bias": layer.bias}
    if module.split(".")[-1].startswith("bn") or module.endswith("downsample.1"):
        return {tv: getattr(layer, k) for tv, k in _KERAS_BN.items()}
    return {"weight": layer.kernel}


def _to_torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 4:  # HWIO -> OIHW
        return (shape[3], shape[2], shape[0], shape[1])
    if len(shape) == 2:  # (in, out) -> (out, in)
        return (shape[1], shape[0])
    return shape


def _to_keras(value: np.ndarray) -> np.ndarray:
    if value.ndim == 4:
        return value.transpose(2, 3, 1, 0)
    if value.ndim == 2:
        return value.T
    return value


def _keras_resnet(model: Any) -> Any:
    if hasattr(model, "torchvision_layers"):
        return model
    for layer in getattr(model, "layers", []):
        if hasattr(layer, "torchvision_layers"):
            return layer
    return None


def _targets(model: Any, framework: str) -> dict[str, tuple[tuple[int, ...], Any]]:
    """torchvision name -> (shape in torch's layout, where to put it) for ``model``."""
    if framework == "torch":
        if not hasattr(model, "blocks_per_stage"):
            raise ConfigError(f"model.pretrained: torchvision ResNet weights load into hvdtrain's resnet18, resnet34, "
                              f"resnet50 and resnet101, not {type(model).__name__}")
        state = model.state_dict()
        return {tv: (tuple(state[key].shape), key) for tv, key in torch_names(model).items()}
    resnet = _keras_resnet(model)
    if resnet is None:
        raise ConfigError(f"model.pretrained: torchvision ResNet weights load into hvdtrain's resnet18, resnet34, "
                          f"resnet50 and resnet101, not {getattr(model, 'name', type(model).__name__)}")
    targets = {}
    for module, layer_name in resnet.torchvision_layers.items():
        for suffix, variable in _keras_variables(resnet.get_layer(layer_name), module).items():
            targets[f"{module}.{suffix}"] = (_to_torch_shape(tuple(variable.shape)), variable)
    return targets


def _listing(keys: list[str], limit: int = 6) -> str:
    keys = sorted(keys, key=_natural)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _natural(key: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def load_torchvision_resnet(model: Any, path: str | Path, framework: str) -> list[str]:
    """Load the torchvision-layout ResNet weights at ``path`` into ``model`` (an hvdtrain ResNet:
    ``framework`` ``torch`` or ``tensorflow``; the Keras one may sit inside the input-normalising
    wrapper). The final ``fc`` is skipped when its class count differs from the model's (the head is
    re-initialised); anything else that does not match raises :class:`~hvdtrain.ConfigError` naming
    the keys, before any weight is assigned. Returns notes for the user (the skipped head)."""
    targets = _targets(model, framework)
    state = read_state_dict(path, framework)
    notes = []
    fc_file, fc_model = state.get("fc.weight"), targets.get("fc.weight")
    if fc_file is not None and fc_model is not None and fc_file.ndim == 2 \
            and fc_file.shape[1] == fc_model[0][1] and fc_file.shape[0] != fc_model[0][0]:
        notes.append(f"model.pretrained: {Path(path).name}'s fc has {fc_file.shape[0]} classes, the dataset "
                     f"{fc_model[0][0]}: the classification head starts from a fresh initialisation")
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        targets = {k: v for k, v in targets.items() if not k.startswith("fc.")}
    missing = [k for k in targets if k not in state and not k.endswith(OPTIONAL)]
    unexpected = [k for k in state if k not in targets and not (k.endswith(OPTIONAL) and framework != "torch"
                                                                 and k[:-len(OPTIONAL)] + "weight" in targets)]
    shapes = [f"{k} {tuple(state[k].shape)} vs the model's {targets[k][0]}" for k in targets
              if k in state and tuple(state[k].shape) != targets[k][0]]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} key(s): {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} key(s): {_listing(unexpected)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es): {'; '.join(sorted(shapes, key=_natural)[:4])}")
    if problems:
        model_name = architecture(targets) or type(model).__name__
        held = architecture(state)
        raise ConfigError(f"model.pretrained: {path}{f' (a {held})' if held else ''} does not match the model "
                          f"({model_name}, {framework}): " + "; ".join(problems) + " (nothing was loaded)")
    if framework == "torch":
        import torch

        loaded = {key: torch.from_numpy(np.ascontiguousarray(state[tv])) for tv, (_, key) in targets.items()
                  if tv in state}
        model.load_state_dict(loaded, strict=False)
    else:
        for tv, (_, variable) in targets.items():
            variable.assign(_to_keras(state[tv]).astype(np.dtype(variable.dtype)))
    return notes


def save_torchvision_resnet(model: Any, path: str | Path) -> None:
    """Write an hvdtrain torch ResNet's weights under torchvision's names (``.pth`` or
    ``.safetensors``): the layout :func:`load_torchvision_resnet` reads, and torchvision too."""
    import torch

    state = model.state_dict()
    tv_state = {tv: state[key].detach().cpu().contiguous() for tv, key in torch_names(model).items()}
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(tv_state, str(path))
    else:
        torch.save(tv_state, path)
