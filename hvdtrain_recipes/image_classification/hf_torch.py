"""A Hugging Face image-classification directory in torch: ``AutoModelForImageClassification``
with a fresh head sized to the dataset's classes, behind the checkpoint's normalisation."""

from __future__ import annotations

from pathlib import Path

import torch

from hvdtrain_recipes.image_classification.hf_models import (HEAD_NAME, HFImageModel, HFModelError, head_weights,
                                                             label_maps)
from hvdtrain_recipes.model_files import ModelFileError, from_pretrained


class HFImageClassifier(torch.nn.Module):
    """Takes the pipeline's uint8 NHWC batch (or float NCHW already normalised), normalises it with
    the checkpoint's mean and std (a grayscale batch is repeated to the model's channels) and
    returns the Hugging Face model's logits. The head is ``model.classifier``."""

    def __init__(self, model: torch.nn.Module, mean, std):
        super().__init__()
        self.model = model
        self.channels = int(getattr(model.config, "num_channels", 3))
        self.register_buffer("scaled_mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) * 255,
                             persistent=False)
        self.register_buffer("scaled_std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255,
                             persistent=False)

    def pixel_values(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - 255 mean) / (255 std)`` of a uint8 NHWC batch as float32 NCHW."""
        if x.dtype != torch.uint8:
            return x
        x = x.permute(0, 3, 1, 2).float()
        if x.shape[1] == 1 and self.channels != 1:
            x = x.expand(-1, self.channels, -1, -1)
        return (x - self.scaled_mean) / self.scaled_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=self.pixel_values(x)).logits


def _load_pretrained(hf: HFImageModel, labels: list[str]):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model, info = from_pretrained(  # trust_remote_code=False; an auto_map or pickled weights: one line
            transformers.AutoModelForImageClassification, hf.path, num_labels=len(labels), **label_maps(labels), ignore_mismatched_sizes=True,
            output_loading_info=True, dtype=torch.float32)
    except ModelFileError:  # code of the folder's own, pickled weights: said in one line already
        raise
    except ValueError as exc:  # an architecture transformers has no image classifier for
        raise HFModelError(f"cannot load {hf.path} as an image classifier (model_type "
                           f"{hf.model_type!r}): {str(exc).splitlines()[0]}") from None
    except OSError as exc:  # unreadable weights (from_pretrained names a pickled or truncated file itself)
        raise HFModelError(f"cannot read the weights in {hf.path}: {str(exc).splitlines()[0]}") from None
    return model, info


def check_loading_info(hf: HFImageModel, info: dict) -> None:
    """Stop (HFModelError naming the keys) if the weights do not match the architecture: missing
    or unexpected keys outside the classification head."""
    head = lambda key: HEAD_NAME in key.split(".")  # noqa: E731  (the head is replaced anyway)
    missing = sorted(k for k in info.get("missing_keys", ()) if not head(k))
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not head(k))
    mismatched = sorted(str(k[0] if isinstance(k, (tuple, list)) else k)
                        for k in info.get("mismatched_keys", ()) if not head(str(k[0] if isinstance(k, (tuple, list)) else k)))
    problems = []
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", mismatched)):
        if keys:
            shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
            problems.append(f"{len(keys)} {what} key(s): {shown}")
    if problems:
        raise HFModelError(f"the weights in {hf.path} do not match its config.json ({hf.model_type}, "
                           f"{(hf.config.get('architectures') or ['?'])[0]}): " + "; ".join(problems)
                           + " (nothing was trained)")


def load_model(hf: HFImageModel, labels: list[str], seed: int) -> HFImageClassifier:
    """The pretrained model of ``hf`` with a head for ``labels`` drawn from ``seed``
    (:func:`hvdtrain_recipes.image_classification.hf_models.head_weights`: the TensorFlow model gets the same)."""
    model, info = _load_pretrained(hf, labels)
    check_loading_info(hf, info)
    head = getattr(model, HEAD_NAME, None)  # a Linear, or (ResNet) Flatten + Linear
    if head is not None and not isinstance(head, torch.nn.Linear):
        head = ([m for m in head.modules() if isinstance(m, torch.nn.Linear)] or [None])[-1]
    if not isinstance(head, torch.nn.Linear):
        raise HFModelError(f"{type(model).__name__} from {hf.path} has no linear '{HEAD_NAME}' head to resize")
    kernel, bias = head_weights(head.in_features, len(labels), seed, hf.config.get("initializer_range", 0.02))
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(kernel.T))
        head.bias.copy_(torch.from_numpy(bias))
    return HFImageClassifier(model.float(), hf.preprocessing.mean, hf.preprocessing.std)


def load_export(folder: Path, mean, std) -> HFImageClassifier:
    """A fine-tuned model exported with ``save_pretrained`` (for ``hvdtrain predict``)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = from_pretrained(transformers.AutoModelForImageClassification, folder, dtype=torch.float32)
    return HFImageClassifier(model, mean, std).eval()
