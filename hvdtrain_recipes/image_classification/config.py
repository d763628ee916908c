"""The image-classification recipe's own config section, ``image`` (``--set image.key=value`` or a
file's ``image:`` section; ``hvdtrain recipe image-classification --keys`` lists it): the options of
:func:`hvdtrain.data.open_images`, :class:`hvdtrain.data.ImageOptions`, as they are.

Three keys used to live in the core's ``data`` section; their old spellings still work, with a
note: ``data.image_size`` -> ``image.size``, ``data.augment`` -> ``image.augment``,
``data.bad_files`` -> ``image.bad_files``.
"""

from __future__ import annotations

from hvdtrain.data import ImageOptions

MOVED_KEYS = {"data.image_size": "image.size", "data.augment": "image.augment", "data.bad_files": "image.bad_files"}
ImageConfig = ImageOptions  # the section's name in this recipe (tests and older code import it from here)
