"""The image-classification recipe's own config section, ``image`` (``--set image.key=value`` or a
file's ``image:`` section; ``hvdtrain recipe image-classification --keys`` lists it).

Three keys used to live in the core's ``data`` section; their old spellings still work, with a
note: ``data.image_size`` -> ``image.size``, ``data.augment`` -> ``image.augment``,
``data.bad_files`` -> ``image.bad_files``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import option
from hvdtrain.data.transforms import POLICIES

MOVED_KEYS = {"data.image_size": "image.size", "data.augment": "image.augment", "data.bad_files": "image.bad_files"}


@dataclass
class ImageConfig:
    """Image size, transforms, decoding workers, bad files and the validation layout."""

    size: int | None = option(None, "square side of the images the model sees; None: the native size for "
                              "images up to 64 pixels, 224 for larger ones", min=8, max=4096)
    transform: str = option("auto", "transform policy: 'imagenet' (train: RandomResizedCrop 0.08-1, 3/4-4/3 + flip; "
                            "val: resize to size/0.875 + centre crop), 'pad-crop' (squash, reflection-pad, random "
                            "crop + flip), 'resize' (squash only), 'auto' (pad-crop up to 64 pixels, else imagenet)",
                            choices=POLICIES)
    augment: bool | None = option(None, "augment training images; None: colour images yes, grayscale no "
                                  "(digits must not be flipped); false trains on the validation transform")
    workers: int | None = option(None, "decoding processes per rank; None: the cores each local rank can have; "
                                 "0 decodes in the training process", min=0, max=256)
    bad_files: str = option("error", "unreadable images, found when decoded: 'error' stops naming the file, "
                            "'skip' trains on a deterministic stand-in sample (same on every rank) and reports "
                            "the count per epoch", choices=("error", "skip"))
    val_labels: str | None = option(None, "labels CSV of a flat validation folder (root/val/*.JPEG): ImageNet's "
                                    "LOC_val_solution.csv (ImageId,PredictionString) or file,class rows; None: "
                                    "root/val/<class>/ folders")
    index_cache: str | None = option(None, "where the cached file index lives; None: $HVDTRAIN_DATA_CACHE/index "
                                     "(default ~/.cache/hvdtrain/data/index)")
