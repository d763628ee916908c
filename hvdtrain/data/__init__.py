"""A framework-free image pipeline (NumPy + Pillow; imports neither torch nor TensorFlow).

:func:`open_images` (:mod:`hvdtrain.data.images`) is the one call that opens image data in any
layout it reads (an ImageFolder tree, a flat validation folder with labels, WebDataset, Parquet,
Arrow; local or remote; read at random or streamed) and returns the train and validation datasets
and the class names; its options are :class:`ImageOptions` (:mod:`hvdtrain.data.options`, also a
recipe's ``image`` config section). Below it:

* :mod:`hvdtrain.data.layouts`: a root's layout (detected or named) and each split's shard files or URLs.
* :mod:`hvdtrain.data.index`: a compact, cached index of one split (per sample a key, a label and
  a location), built once per host under a lock (:mod:`hvdtrain.data.entries`) and memory-mapped
  by every rank; :mod:`hvdtrain.data.shards` indexes WebDataset tars, Parquet and Arrow shards
  (:mod:`hvdtrain.data.braces` expands shard patterns).
* :mod:`hvdtrain.data.reader`: reads a sample's encoded bytes wherever the index says it is (a
  file, a byte span of a shard, a Parquet row), locally or from a URL (:mod:`hvdtrain.data.remote`:
  fsspec, range requests).
* :mod:`hvdtrain.data.stream`: streaming mode for remote shards: a per-epoch plan of whole shards
  cut into lanes (one per rank), read ahead into a bounded local spool.
* :mod:`hvdtrain.data.transforms`: the transform policies (ImageNet RandomResizedCrop + flip,
  resize + centre crop, pad-and-crop for small images), every random draw from
  ``(seed, epoch, sample index)`` alone.
* :mod:`hvdtrain.data.decode`: decode only what a crop needs (JPEG DCT scaling, crop-box resize).
* :mod:`hvdtrain.data.workers`: decoding processes that write uint8 pixels into shared memory
  and never outlive the trainer.
* :mod:`hvdtrain.data.pipeline`: :class:`~hvdtrain.data.pipeline.ImageDataset`, the
  ``get_batch`` dataset the training loop consumes: uint8 NHWC batches and int64 labels.

Normalisation and layout conversion happen framework-side (``hvdtrain.torch.images``,
``hvdtrain.tensorflow.images``), on the device where there is one. Importing this package
loads nothing (its modules are imported by name, its public names on first use), so config code
can use the transform names without Pillow.
"""

from hvdtrain import _lazy

_EXPORTS = {"hvdtrain.data.images": ["ImageData", "open_images"], "hvdtrain.data.options": ["ImageOptions"],
            "hvdtrain.data.errors": ["DataError"]}
__getattr__, __dir__, __all__ = _lazy.exports(__name__, _EXPORTS)
