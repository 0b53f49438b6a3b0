"""The package metadata lives in setup.cfg; here only the optional compiled crop kernel.

``readers/images/jpegcrop.c`` needs a C compiler, Python's headers and libjpeg's
(``libjpeg62-turbo-dev`` on Debian). Where it cannot be built the package installs all the
same, with a warning, and crops decode through the Python path
(:mod:`readers.images.kernel` says so once at run time).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNEL = Extension(
    "readers.images.jpegcrop",
    sources=["readers/images/jpegcrop.c"],
    libraries=["jpeg"],
    # -ffp-contract=off: the resize weights must be the doubles torch computes (no FMA)
    extra_compile_args=["-O3", "-ffp-contract=off"],
    optional=True,
)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the kernel cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all: setuptools raises before `optional`
            self.warn(f"the crop kernel was not built ({e}); crops use the Python path")


setup(ext_modules=[KERNEL], cmdclass={"build_ext": OptionalBuildExt})
