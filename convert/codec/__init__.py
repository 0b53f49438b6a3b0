"""The converter's codec room: what happens to one image between its source and a shard.

``convert.codec.recipe``: the recipe (:class:`Transform`) and :func:`code_image`, which
decodes (the compiled kernel where it takes the JPEG, else ``readers.images.decode``), turns
the image upright, checks its pixels against the decompression-bomb limit, applies the DCT
rule, resizes, crops and encodes (JPEG with restart markers unless told not).
``convert.codec.geometry``: torchvision's ``Resize`` and ``CenterCrop`` on uint8 pixels.
:func:`convert.process.prepare` calls :func:`code_image` once per sample.
"""

from convert.codec.geometry import center_crop, resize_shorter, shorter_size
from convert.codec.recipe import DCT_REDUCING_GAP, Coded, Transform, code_image

__all__ = [
    "DCT_REDUCING_GAP",
    "Coded",
    "Transform",
    "center_crop",
    "code_image",
    "resize_shorter",
    "shorter_size",
]
