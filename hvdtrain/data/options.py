"""The options of :func:`hvdtrain.data.open_images`: one dataclass, usable as a recipe's ``image`` config section.

The image-classification recipe declares it as its ``image`` section (``--set image.key=value``,
a config file's ``image:`` mapping; ``hvdtrain recipe image-classification --keys`` lists it),
and so can a recipe of your own: ``hvdtrain.define_recipe(NAME, sections={"image": ImageOptions})``
gives it the same keys, checks and help, and ``open_images(root, config.sections["image"], ...)``
reads them. Outside a run, build it directly: ``ImageOptions(size=64, workers=0)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.core.config_schema import option  # the schema alone (no loader): how every config key is declared
from hvdtrain.data.remote import READ_MODES
from hvdtrain.data.transforms import POLICIES

FORMATS = ("auto", "folder", "webdataset", "parquet", "arrow")


@dataclass
class ImageOptions:
    """Image size, transforms, decoding workers, bad files, the data's storage format and the validation layout."""

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
    format: str = option("auto", "how --data stores the images: 'folder' (ImageFolder train/ + val/), 'webdataset' "
                         "(tar shards: <key>.jpg + <key>.cls|.json), 'parquet' (Hugging Face Parquet: image struct "
                         "{bytes, path} + label), 'arrow' (datasets save_to_disk), 'auto' (detected from the layout)",
                         choices=FORMATS)
    train_shards: str | None = option(None, "training shards: a brace pattern (train-{000000..001023}.tar), a glob "
                                      "or a folder, relative to --data (to the current folder without --data), "
                                      "absolute or a URL; None: the format's usual place (train/*.tar or "
                                      "*train*.tar, data/train-*.parquet or train/*.parquet, save_to_disk's train "
                                      "split)", resume="data")
    val_shards: str | None = option(None, "validation shards, as image.train_shards; None: the val, validation or "
                                    "test split in the format's usual place")
    image_column: str | None = option(None, "Parquet/Arrow image column ({bytes, path} struct or binary); None: the "
                                      "column whose feature is Image, else 'image' or 'img'", resume="data")
    label_column: str | None = option(None, "Parquet/Arrow label column; None: 'label' or 'labels'", resume="data")
    index_cache: str | None = option(None, "where the cached file index lives; None: $HVDTRAIN_DATA_CACHE/index "
                                     "(default ~/.cache/hvdtrain/data/index)")
    read: str = option("auto", "how shards are read: 'random' (each sample where the index says: one range request "
                       "per sample for remote shards), 'stream' (each rank downloads whole shards in an order drawn "
                       "from (seed, epoch), a few ahead, into a local spool), 'auto' (stream for remote shards "
                       "(URLs), random for local ones); ImageFolder trees are read at random", choices=READ_MODES,
                       resume="data")
    stream_lanes: int | None = option(None, "streaming: the epoch's shards are cut into this many lanes, lane r read "
                                      "by rank r; None: the world size at start. Set it for elastic runs or to "
                                      "resume on another world size (it must not change within a run)", min=1,
                                      resume="data")
    spool_dir: str | None = option(None, "streaming: the folder the per-rank spool of whole shards is made in "
                                   "(removed at exit); None: $TMPDIR or /tmp")
    spool_mb: int = option(2048, "streaming: the most MiB of shards each rank spools and downloads at once", min=1)
    spool_shards: int = option(4, "streaming: the most shards each rank spools and downloads at once (at least 2 "
                               "keeps the next shard coming while one is read)", min=1)
