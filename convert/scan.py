"""Find the samples of an ImageNet-layout folder with torchvision ``ImageFolder`` semantics.

Classes are the sorted names of SRC's sub-folders (``class_to_idx`` maps each to its
position); samples are the files with an image extension below each class folder, walked
in sorted order, following symlinks. Other files (``.txt``, ``.DS_Store``) are ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IMG_EXTENSIONS", "Sample", "find_classes", "scan_folder"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Sample:
    """One source image: its path relative to SRC and its class index."""

    relpath: str
    label: int


def find_classes(src: Path) -> list[str]:
    """Sorted sub-folder names of ``src``, as ``ImageFolder.find_classes`` returns them."""
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: source folder does not exist or is not a folder")
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"{src}: no class sub-folders (expected SRC/<class>/<image>)")
    return classes


def scan_folder(src: Path) -> tuple[list[str], list[Sample]]:
    """Return ``(classes, samples)`` of ``src`` in ImageFolder order."""
    classes = find_classes(src)
    samples = []
    for label, name in enumerate(classes):
        class_dir = src / name
        for dirpath, _, filenames in sorted(os.walk(class_dir, followlinks=True)):
            for fname in sorted(filenames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    rel = os.path.relpath(os.path.join(dirpath, fname), src)
                    samples.append(Sample(rel, label))
    if not samples:
        raise FileNotFoundError(f"{src}: no images found (extensions: {', '.join(IMG_EXTENSIONS)})")
    return classes, samples
