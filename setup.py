"""The package metadata lives in setup.cfg; here only the optional compiled modules: the
crop kernel, the batch CRC-32 (``readers/formats/crc32.c``) and the epoch order's Feistel
network (``readers/epochs/feistel.c``); the last two need only a compiler.

The kernel (``readers/images/``: the binding ``jpegcrop.c`` and the units of
``KERNEL_UNITS``, each with its header) needs a C compiler, Python's headers and libjpeg's
(``libjpeg62-turbo-dev`` on Debian). Where it cannot be built the package installs all the
same, with a warning, and crops decode through the Python path
(:mod:`readers.images.kernel` says so once at run time).

With ``IMGPACK_LIBJPEG_PREFIX`` set (release wheels, ``scripts/wheels/cibuildwheel.toml``)
the kernel links that prefix's static ``lib/libjpeg.a`` instead of the system's libjpeg;
its symbols stay hidden inside the module (``--exclude-libs,ALL``, ``-fvisibility=hidden``:
only ``PyInit_*`` is exported, ``scripts/wheels/check_wheel.py`` checks).
"""

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError

STATIC_PREFIX = os.environ.get("IMGPACK_LIBJPEG_PREFIX")
if STATIC_PREFIX:
    LIBJPEG = {
        "include_dirs": [os.path.join(STATIC_PREFIX, "include")],
        "extra_objects": [os.path.join(STATIC_PREFIX, "lib", "libjpeg.a")],
    }
else:
    LIBJPEG = {"libraries": ["jpeg"]}

KERNEL = "readers/images"
# The kernel's units (readers/images/UNIT.c with UNIT.h), the binding jpegcrop.c first.
KERNEL_UNITS = [
    "jpegcrop",
    "decode_box",
    "restarts",
    "place",
    "resize_avx2",
    "resize_scalar",
    "markers",
    "encoder",
    "errors",
    "huffman",
    "scratch",
    "taps",
]
# Nothing but PyInit_* leaves a module: not the units' functions, not a static libjpeg's.
HIDDEN = {
    "extra_compile_args": ["-fvisibility=hidden"],
    "extra_link_args": ["-Wl,--exclude-libs,ALL"],
}
# -flto: the units inline into each other as the one file did (crops ~1.5 % slower without);
# a toolchain that cannot run its LTO plugin builds the kernel without it (OptionalBuildExt)
LTO = ["-flto", "-O3"]

CROP_KERNEL = Extension(
    "readers.images.jpegcrop",
    sources=[f"{KERNEL}/{unit}.c" for unit in KERNEL_UNITS],
    depends=sorted(str(p) for p in Path(KERNEL).glob("*.h")),
    # -ffp-contract=off: the resize weights must be the doubles torch computes (no FMA)
    extra_compile_args=["-O3", "-ffp-contract=off", "-flto", *HIDDEN["extra_compile_args"]],
    extra_link_args=[*HIDDEN["extra_link_args"], *LTO],
    optional=True,
    **LIBJPEG,
)


def compiler_only(name: str) -> Extension:
    """An optional module of one C file, named as the module, that needs no library."""
    return Extension(
        name,
        sources=[name.replace(".", "/") + ".c"],
        extra_compile_args=["-O3", *HIDDEN["extra_compile_args"]],
        extra_link_args=HIDDEN["extra_link_args"],
        optional=True,
    )


# readers.formats.checks: the CRC-32s of a batch of samples, the GIL released.
BATCH_CRC = compiler_only("readers.formats.crc32")
# readers.epochs.order: FeistelOrder's network over a batch of positions, the GIL released.
FEISTEL = compiler_only("readers.epochs.feistel")


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the kernel cannot be compiled, and
    builds it without link-time optimisation where the toolchain has none (a gcc without
    its ``lto-wrapper``, as on one CUDA image we met)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all: setuptools raises before `optional`
            self.warn(f"the compiled modules were not built ({e}); imgpack uses its Python paths")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except CCompilerError as e:
            if "-flto" not in ext.extra_link_args:
                raise
            self.warn(f"{ext.name}: link-time optimisation failed ({e}); building without it")
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a != "-flto"]
            ext.extra_link_args = [a for a in ext.extra_link_args if a != "-flto"]
            super().build_extension(ext)


setup(ext_modules=[CROP_KERNEL, BATCH_CRC, FEISTEL], cmdclass={"build_ext": OptionalBuildExt})
