"""The package metadata lives in setup.cfg; here only the optional compiled crop kernel.

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

KERNEL = Extension(
    "readers.images.jpegcrop",
    sources=["readers/images/jpegcrop.c"],
    # -ffp-contract=off: the resize weights must be the doubles torch computes (no FMA)
    extra_compile_args=["-O3", "-ffp-contract=off"],
    optional=True,
    **LIBJPEG,
)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the kernel cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all: setuptools raises before `optional`
            self.warn(f"the crop kernel was not built ({e}); crops use the Python path")


setup(ext_modules=[KERNEL], cmdclass={"build_ext": OptionalBuildExt})
