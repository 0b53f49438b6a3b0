"""The package metadata lives in setup.cfg; here only the optional compiled modules: the
crop kernel and the batch CRC-32 (``readers/formats/crc32.c``, which needs only a compiler).

``readers/images/jpegcrop.c`` needs a C compiler, Python's headers and libjpeg's
(``libjpeg62-turbo-dev`` on Debian). Where it cannot be built the package installs all the
same, with a warning, and crops decode through the Python path
(:mod:`readers.images.kernel` says so once at run time).

With ``IMGPACK_LIBJPEG_PREFIX`` set (release wheels, ``scripts/wheels/cibuildwheel.toml``)
the kernel links that prefix's static ``lib/libjpeg.a`` instead of the system's libjpeg.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

STATIC_PREFIX = os.environ.get("IMGPACK_LIBJPEG_PREFIX")
if STATIC_PREFIX:
    LIBJPEG = {
        "include_dirs": [os.path.join(STATIC_PREFIX, "include")],
        "extra_objects": [os.path.join(STATIC_PREFIX, "lib", "libjpeg.a")],
    }
else:
    LIBJPEG = {"libraries": ["jpeg"]}

CROP_KERNEL = Extension(
    "readers.images.jpegcrop",
    sources=["readers/images/jpegcrop.c", "readers/images/huffman.c"],
    depends=["readers/images/huffman.h"],
    # -ffp-contract=off: the resize weights must be the doubles torch computes (no FMA)
    extra_compile_args=["-O3", "-ffp-contract=off"],
    optional=True,
    **LIBJPEG,
)


# readers.formats.checks: the CRC-32s of a batch of samples, the GIL released (no library).
BATCH_CRC = Extension(
    "readers.formats.crc32",
    sources=["readers/formats/crc32.c"],
    extra_compile_args=["-O3"],
    optional=True,
)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the kernel cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all: setuptools raises before `optional`
            self.warn(f"the compiled modules were not built ({e}); imgpack uses its Python paths")


setup(ext_modules=[CROP_KERNEL, BATCH_CRC], cmdclass={"build_ext": OptionalBuildExt})
