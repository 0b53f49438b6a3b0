"""Stored bytes to pixels in a batch row: the decoders (:mod:`~readers.images.decode`),
JPEG markers (:mod:`~readers.images.jpeg`), libjpeg-turbo through ctypes
(:mod:`~readers.images.turbo`), the crop boxes (:mod:`~readers.images.crop`), the fused
decode-crop-resize (:mod:`~readers.images.fused`), the compiled crop kernel
(:mod:`~readers.images.kernel`) and the decode threads (:mod:`~readers.images.pool`)."""
