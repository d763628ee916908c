"""A framework-free image pipeline (NumPy + Pillow; imports neither torch nor TensorFlow).

* :mod:`hvdtrain.data.index`: a compact, cached index of an image tree (relative paths and labels
  in arrays), built once per host under a lock and memory-mapped by every rank.
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
loads nothing (its modules are imported by name), so config code can use the transform names
without Pillow.
"""
