"""Find the samples of an ImageNet-layout folder with torchvision ``ImageFolder`` semantics.

Classes are the sorted names of SRC's sub-folders (``class_to_idx`` maps each to its
position; an empty class folder is still a class); samples are the files with an image
extension below each class folder, walked in sorted order, following symlinks. Other files
(``.txt``, ``.DS_Store``) are ignored. Where ``ImageFolder`` would hang, crash or label an
image twice, the scan reports a problem instead, reads nothing through it and goes on: a
symlink to SRC, to the folder it sits in or to any folder above it (a loop), a symlink from
one class folder into another part of SRC (``ImageFolder`` would give that class's images
a second label; a link to a folder outside SRC is followed), a broken symlink, an image
name that is not a regular file (a FIFO would block the reader), a folder that cannot be
listed.

Unlike ``ImageFolder``, entries whose name starts with ``.`` (``.ipynb_checkpoints``,
macOS ``._*`` files, ``.Trash``) are skipped by default, at every level, and listed in
``Scan.hidden``: a hidden folder would otherwise become class 0 and shift every label.
Images lying at the top of SRC, in no class folder, are reported as problems.
"""

from __future__ import annotations

import csv
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convert.samples import Sample, SampleTable
from readers.fields import Schema
from readers.spec import UNLABELED

__all__ = [
    "HEADER_NAMES",
    "IMG_EXTENSIONS",
    "Sample",
    "Scan",
    "find_classes",
    "read_labels",
    "scan_folder",
    "scan_source",
]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class Scan:
    """What a scan found: the classes, the samples in order, and what it had to pass over
    (``{"path": relpath, "error": reason}``, as ``errors.jsonl`` lists them)."""

    classes: list[str]
    samples: SampleTable
    problems: list[dict[str, str]] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # relative paths skipped as hidden
    empty_classes: list[str] = field(default_factory=list)  # listed, but no folder
    fixed_shape: tuple[int, int, int] | None = None  # every sample's raw [H, W, 3], if one
    fields: Schema = field(default_factory=dict)  # what each sample carries (readers.fields)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def find_classes(src: Path, include_hidden: bool = False) -> list[str]:
    """Sorted sub-folder names of ``src``, as ``ImageFolder.find_classes`` returns them
    (but for hidden ones, unless ``include_hidden``)."""
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: source folder does not exist or is not a folder")
    classes = sorted(
        e.name for e in os.scandir(src) if e.is_dir() and (include_hidden or not _hidden(e.name))
    )
    if not classes:
        raise FileNotFoundError(
            f"{src}: no class sub-folders (expected SRC/<class>/<image>); for a flat folder "
            "pass --labels FILE (rows of relative_path,label_name) or --unlabeled"
        )
    return classes


def scan_folder(
    src: Path, include_hidden: bool = False, classes: Sequence[str] | None = None
) -> Scan:
    """Return the classes and samples of ``src`` in ImageFolder order, and any problems.

    ``classes`` fixes the class list (and so the labels: a validation folder missing a
    class keeps the training set's numbers); a sub-folder not in it is a ValueError, a
    listed class without a folder is allowed and listed in ``Scan.empty_classes``."""
    folders = find_classes(src, include_hidden)
    if classes is not None:
        unknown = [f for f in folders if f not in classes]
        if unknown:
            raise ValueError(
                f"{src / unknown[0]}: folder is not in the class list ({len(classes)} classes"
                f"{f'; also {len(unknown) - 1} more' if len(unknown) > 1 else ''}): add it to the "
                "list or move it out of SRC"
            )
    scan = Scan(list(classes) if classes is not None else folders, SampleTable())
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if _hidden(entry.name) and not include_hidden:
            scan.hidden.append(entry.name)
        elif not entry.is_dir() and entry.name.lower().endswith(IMG_EXTENSIONS):
            scan.problems.append(
                {
                    "path": entry.name,
                    "error": "not in a class folder (SRC/<class>/<image>): ignored",
                }
            )
    for label, name in enumerate(scan.classes):
        if not os.path.isdir(os.path.join(src, name)):
            scan.empty_classes.append(name)
            continue
        listing: list[tuple[str, list[str]]] = []
        folder = os.path.join(src, name)
        above = _chain(os.path.realpath(src)) | _chain(os.path.dirname(os.path.realpath(folder)))
        _walk(src, folder, above, listing, scan, include_hidden, label_root=folder)
        for dirpath, filenames in sorted(listing):  # ImageFolder: sorted(os.walk(...))
            for fname in sorted(filenames):
                path = os.path.join(dirpath, fname)
                problem = _not_a_file(path)
                if problem:
                    scan.problems.append({"path": os.path.relpath(path, src), "error": problem})
                else:
                    scan.samples.append(os.path.relpath(path, src), label)
    if not scan.samples:
        raise FileNotFoundError(
            f"{src}: no images found (extensions: {', '.join(IMG_EXTENSIONS)})"
            + (f"; {len(scan.problems)} file(s) unusable" if scan.problems else "")
        )
    return scan


def scan_source(
    src: Path,
    *,
    include_hidden: bool = False,
    classes: Sequence[str] | None = None,
    labels_file: Path | None = None,
    unlabeled: bool = False,
) -> Scan:
    """The samples of ``src``: from its class folders (:func:`scan_folder`), from a labels
    file naming a class per image (any layout), or every image unlabelled
    (``spec.UNLABELED``)."""
    if labels_file is None and not unlabeled:
        return scan_folder(src, include_hidden, classes)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: source folder does not exist or is not a folder")
    scan = Scan([], SampleTable())
    listing: list[tuple[str, list[str]]] = []
    above = _chain(os.path.dirname(os.path.realpath(src)))
    _walk(src, str(src), above, listing, scan, include_hidden)
    found = [
        os.path.relpath(os.path.join(d, f), src)
        for d, names in sorted(listing)
        for f in sorted(names)
    ]
    if unlabeled:
        for rel in found:
            scan.samples.append(rel, UNLABELED)
    elif labels_file is not None:
        labels = read_labels(labels_file)
        names = list(classes) if classes is not None else sorted(set(labels.values()))
        unknown = sorted(set(labels.values()) - set(names))
        if unknown:
            raise ValueError(f"{labels_file}: label {unknown[0]!r} is not in the class list")
        scan.classes = names
        index = {name: i for i, name in enumerate(names)}
        for rel in found:
            if rel in labels:
                scan.samples.append(rel, index[labels.pop(rel)])
            else:
                scan.problems.append({"path": rel, "error": f"not in {labels_file.name}: ignored"})
        scan.problems += [
            {"path": rel, "error": f"listed in {labels_file.name} but not found"} for rel in labels
        ]
    usable = SampleTable()
    for sample in scan.samples:
        problem = _not_a_file(os.path.join(src, sample.relpath))
        if problem:
            scan.problems.append({"path": sample.relpath, "error": problem})
        else:
            usable.append(sample.relpath, sample.label)
    scan.samples = usable
    if not scan.samples:
        raise FileNotFoundError(f"{src}: no images found (extensions: {', '.join(IMG_EXTENSIONS)})")
    return scan


HEADER_NAMES = frozenset({"path", "relative_path", "relpath", "file", "filename", "image"})


def read_labels(path: Path) -> dict[str, str]:
    """``relative_path -> label name`` from a CSV or TSV file (tab if the first line has
    one), with an optional header row whose first field is ``path``, ``file``, ``image``...
    Paths are relative to SRC and may not leave it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the labels file: {e}") from e
    lines = text.splitlines()
    delimiter = "\t" if lines and "\t" in lines[0] else ","
    labels: dict[str, str] = {}
    for number, row in enumerate(csv.reader(lines, delimiter=delimiter), 1):
        if not row or not any(field.strip() for field in row):
            continue
        if number == 1 and row[0].strip().lower() in HEADER_NAMES:
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ValueError(f"{path}:{number}: expected relative_path{delimiter}label_name")
        rel = os.path.normpath(row[0].strip())
        if os.path.isabs(rel) or rel.split(os.sep)[0] == "..":
            raise ValueError(f"{path}:{number}: {row[0]!r} is not a path inside SRC")
        if rel in labels:
            raise ValueError(f"{path}:{number}: {rel!r} is listed twice")
        labels[rel] = row[1].strip()
    if not labels:
        raise ValueError(f"{path}: no rows of relative_path,label_name")
    return labels


def _walk(
    src: Path,
    folder: str,
    ancestors: frozenset[tuple[int, int]],
    listing: list[tuple[str, list[str]]],
    scan: Scan,
    include_hidden: bool,
    label_root: str | None = None,
) -> None:
    """``os.walk(folder, followlinks=True)`` that reads nothing through a link to a folder
    it is inside (``ancestors``: the device and inode numbers of every folder above, up to
    ``/``, along the real paths walked) and, when ``label_root`` is a class folder, nothing
    through a link into another part of SRC, whose images would come back with this
    class's label."""
    problems = scan.problems
    try:
        info = os.stat(folder)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        problems.append({"path": os.path.relpath(folder, src), "error": f"cannot list: {e}"})
        return
    ancestors = ancestors | {(info.st_dev, info.st_ino)}
    images = []
    for entry in entries:
        if _hidden(entry.name) and not include_hidden:
            scan.hidden.append(os.path.relpath(entry.path, src))
            continue
        try:
            is_dir = entry.is_dir()  # follows symlinks, as os.walk(followlinks=True)
        except OSError:
            is_dir = False
        if not is_dir:
            if entry.name.lower().endswith(IMG_EXTENSIONS):
                images.append(entry.name)
            continue
        below = ancestors
        if entry.is_symlink():
            refusal = _link_refusal(src, entry.path, ancestors, label_root)
            if refusal:
                problems.append({"path": os.path.relpath(entry.path, src), "error": refusal})
                continue
            below = ancestors | _chain(os.path.dirname(os.path.realpath(entry.path)))
        _walk(src, entry.path, below, listing, scan, include_hidden, label_root)
    listing.append((folder, images))


def _chain(folder: str) -> frozenset[tuple[int, int]]:
    """Device and inode numbers of ``folder`` and every folder above it, up to ``/``."""
    chain = set()
    while True:
        info = os.stat(folder)
        chain.add((info.st_dev, info.st_ino))
        parent = os.path.dirname(folder)
        if parent == folder:
            return frozenset(chain)
        folder = parent


def _link_refusal(
    src: Path, link: str, ancestors: frozenset[tuple[int, int]], label_root: str | None
) -> str | None:
    """Why the folder symlink ``link`` must not be followed, or None to follow it."""
    target, real_src = os.path.realpath(link), os.path.realpath(src)
    info = os.stat(target)
    shown = os.path.relpath(target, real_src) if _inside(target, real_src) else target
    if (info.st_dev, info.st_ino) in ancestors:
        where = "SRC itself" if shown == "." else shown
        return f"symlink loop: links to {where}, a folder it is inside; nothing read through it"
    crosses_classes = label_root is not None and not _inside(target, os.path.realpath(label_root))
    if crosses_classes and _inside(target, real_src):
        return (
            f"links to {shown}, inside SRC but outside this class folder: its images "
            "would come back with this class's label too; not followed"
        )
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _not_a_file(path: str) -> str | None:
    """Why ``path`` cannot be read as an image file, or None if it is a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "broken symlink: its target does not exist"
    except OSError as e:
        return f"cannot stat: {e.strerror}"
    if not stat.S_ISREG(mode):
        return "not a regular file (FIFO, socket or device)"
    return None
