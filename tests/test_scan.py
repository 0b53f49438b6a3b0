"""``convert.scan.scan_folder`` follows torchvision ``ImageFolder`` semantics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convert.scan import IMG_EXTENSIONS, Sample, find_classes, scan_folder, scan_source


def touch(root: Path, *relpaths: str) -> None:
    for rel in relpaths:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not decoded by the scan")


def _found(src: Path) -> tuple[list[str], list[Sample]]:
    """Classes and samples of a scan that must find no problem."""
    scan = scan_folder(src)
    assert scan.problems == []
    return scan.classes, scan.samples


def test_classes_are_sorted_subfolder_names_and_labels_follow_their_order(tmp_path):
    touch(tmp_path, "zebra/z.jpg", "Apple/a.jpg", "mango/m.jpg", "banana/b.jpg")
    classes, samples = _found(tmp_path)
    # Plain code-point order, as ImageFolder sorts: upper case before lower case.
    assert classes == ["Apple", "banana", "mango", "zebra"]
    class_to_idx = {c: i for i, c in enumerate(classes)}
    assert samples == [
        Sample("Apple/a.jpg", class_to_idx["Apple"]),
        Sample("banana/b.jpg", class_to_idx["banana"]),
        Sample("mango/m.jpg", class_to_idx["mango"]),
        Sample("zebra/z.jpg", class_to_idx["zebra"]),
    ]


def test_files_are_sorted_within_a_class_whatever_the_creation_order(tmp_path):
    touch(tmp_path, "c/b10.jpg", "c/a.png", "c/b2.jpg", "c/B.jpg")
    _, samples = _found(tmp_path)
    assert [s.relpath for s in samples] == ["c/B.jpg", "c/a.png", "c/b10.jpg", "c/b2.jpg"]
    assert {s.label for s in samples} == {0}


def test_images_in_nested_subfolders_of_a_class_belong_to_that_class(tmp_path):
    touch(tmp_path, "cat/top.jpg", "cat/deep/er/x.jpg", "cat/sub/y.jpg", "dog/d.jpg")
    classes, samples = _found(tmp_path)
    assert classes == ["cat", "dog"]  # nested folders are not classes
    # os.walk order sorted by folder (ImageFolder's make_dataset does the same).
    assert samples == [
        Sample("cat/top.jpg", 0),
        Sample("cat/deep/er/x.jpg", 0),
        Sample("cat/sub/y.jpg", 0),
        Sample("dog/d.jpg", 1),
    ]


def test_upper_case_and_every_listed_extension_count_as_images(tmp_path):
    names = [f"c/img{i}{ext}" for i, ext in enumerate(IMG_EXTENSIONS)]
    names += ["c/upper.JPG", "c/mixed.JpEg", "c/shout.PNG"]
    touch(tmp_path, *names)
    _, samples = _found(tmp_path)
    assert sorted(s.relpath for s in samples) == sorted(names)


def test_non_image_files_are_ignored(tmp_path):
    touch(
        tmp_path,
        "c/good.jpg",
        "c/notes.txt",
        "c/.DS_Store",
        "c/Thumbs.db",
        "c/archive.jpg.zip",
        "c/noext",
        "c/sub/labels.csv",
        "README.md",  # files directly in SRC are not samples either
    )
    _, samples = _found(tmp_path)
    assert samples == [Sample("c/good.jpg", 0)]


def test_an_empty_class_folder_still_takes_its_place_in_classes(tmp_path):
    touch(tmp_path, "a/x.jpg", "c/y.jpg")
    (tmp_path / "b").mkdir()
    classes, samples = _found(tmp_path)
    assert classes == ["a", "b", "c"]
    assert [(s.relpath, s.label) for s in samples] == [("a/x.jpg", 0), ("c/y.jpg", 2)]
    assert find_classes(tmp_path) == classes


def test_sample_data_has_four_classes_of_eight_images(sample_data):
    classes, samples = _found(sample_data)
    assert classes == ["nature", "people", "scenes", "space"]
    assert [sum(s.label == k for s in samples) for k in range(4)] == [8, 8, 8, 8]
    assert all(not Path(s.relpath).is_absolute() for s in samples)
    assert all((sample_data / s.relpath).is_file() for s in samples)


def test_missing_source_folder_raises_file_not_found_naming_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        scan_folder(missing)


def test_source_that_is_a_file_raises_file_not_found(tmp_path):
    path = tmp_path / "file.jpg"
    path.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"file\.jpg"):
        scan_folder(path)


def test_source_without_class_folders_raises_file_not_found(tmp_path):
    touch(tmp_path, "loose.jpg")
    with pytest.raises(FileNotFoundError, match="class sub-folders"):
        scan_folder(tmp_path)


def test_class_folders_without_images_raise_file_not_found(tmp_path):
    touch(tmp_path, "a/notes.txt", "b/.DS_Store")
    (tmp_path / "c").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        scan_folder(tmp_path)


def test_a_symlink_loop_is_reported_not_followed_and_the_rest_is_scanned(tmp_path):
    touch(tmp_path, "c/a.jpg", "c/sub/b.jpg")
    (tmp_path / "c/sub/back").symlink_to(tmp_path / "c")  # c/sub/back -> c: a loop
    (tmp_path / "c/self").symlink_to(".")
    scan = scan_folder(tmp_path)
    assert [s.relpath for s in scan.samples] == ["c/a.jpg", "c/sub/b.jpg"]
    assert [p["path"] for p in scan.problems] == ["c/self", "c/sub/back"]
    assert all("symlink loop" in p["error"] for p in scan.problems)


def test_a_symlinked_folder_outside_the_class_is_followed_like_imagefolder(tmp_path):
    touch(tmp_path, "elsewhere/x.jpg", "src/c/a.jpg")
    (tmp_path / "src/c/linked").symlink_to(tmp_path / "elsewhere")
    scan = scan_folder(tmp_path / "src")
    assert [s.relpath for s in scan.samples] == ["c/a.jpg", "c/linked/x.jpg"]
    assert scan.problems == []


def test_broken_symlinks_and_fifos_named_as_images_are_reported(tmp_path):
    touch(tmp_path, "c/a.jpg")
    (tmp_path / "c/gone.jpg").symlink_to(tmp_path / "missing.jpg")
    os.mkfifo(tmp_path / "c/pipe.jpg")  # opening it would block the conversion forever
    scan = scan_folder(tmp_path)
    assert [s.relpath for s in scan.samples] == ["c/a.jpg"]
    assert scan.problems == [
        {"path": "c/gone.jpg", "error": "broken symlink: its target does not exist"},
        {"path": "c/pipe.jpg", "error": "not a regular file (FIFO, socket or device)"},
    ]


def _loop_tree(root: Path) -> Path:
    """SRC with classes cat and dog (two images each), inside a parent that holds a stray
    image: what a link may reach but must not read."""
    touch(root, "stray.jpg", "src/cat/c1.jpg", "src/cat/c2.jpg", "src/dog/d1.jpg", "src/dog/d2.jpg")
    return root / "src"


@pytest.mark.parametrize(
    ("link", "target", "shown"),
    [
        ("dog/up", "..", "SRC itself"),  # ln -s .. SRC/dog/up
        ("dog/self", ".", "dog"),  # the class folder
        ("dog/sub/back", "..", "dog"),  # the class folder, from a sub-folder
        ("dog/parent", "../..", "{parent}"),  # the folder that holds SRC
    ],
)
def test_a_link_to_src_or_any_folder_above_it_is_a_loop_and_reads_nothing(
    tmp_path, link, target, shown
):
    src = _loop_tree(tmp_path)
    (src / link).parent.mkdir(parents=True, exist_ok=True)
    (src / link).symlink_to(target)
    scan = scan_folder(src)
    assert [(s.relpath, scan.classes[s.label]) for s in scan.samples] == [
        ("cat/c1.jpg", "cat"),
        ("cat/c2.jpg", "cat"),
        ("dog/d1.jpg", "dog"),
        ("dog/d2.jpg", "dog"),
    ]
    (problem,) = scan.problems
    assert problem["path"] == link
    where = shown.format(parent=os.path.realpath(tmp_path))
    assert problem["error"].startswith(f"symlink loop: links to {where}, a folder it is inside")


def test_a_link_into_another_class_folder_is_refused_not_a_second_label(tmp_path):
    src = _loop_tree(tmp_path)
    (src / "dog/cats").symlink_to("../cat")
    scan = scan_folder(src)
    assert [s.relpath for s in scan.samples] == [
        "cat/c1.jpg",
        "cat/c2.jpg",
        "dog/d1.jpg",
        "dog/d2.jpg",
    ]
    assert scan.problems == [
        {
            "path": "dog/cats",
            "error": "links to cat, inside SRC but outside this class folder: its images "
            "would come back with this class's label too; not followed",
        }
    ]


def test_a_loop_through_a_followed_outside_folder_reads_nothing_above_it(tmp_path):
    # dog/linked -> outside/breeds (followed, like ImageFolder); inside it a link to outside/,
    # the folder above the one it really sits in: a loop, not a door to outside/other.
    touch(tmp_path, "outside/other/o.jpg", "outside/breeds/b.jpg", "src/dog/d.jpg")
    (tmp_path / "src/dog/linked").symlink_to(tmp_path / "outside/breeds")
    (tmp_path / "outside/breeds/up").symlink_to("..")
    scan = scan_folder(tmp_path / "src")
    assert [s.relpath for s in scan.samples] == ["dog/d.jpg", "dog/linked/b.jpg"]
    assert [p["path"] for p in scan.problems] == ["dog/linked/up"]
    assert "symlink loop" in scan.problems[0]["error"]


def test_an_unlabeled_scan_reads_nothing_through_a_link_above_src(tmp_path):
    src = _loop_tree(tmp_path)
    (src / "dog/parent").symlink_to("../..")
    scan = scan_source(src, unlabeled=True)
    assert sorted(s.relpath for s in scan.samples) == [
        "cat/c1.jpg",
        "cat/c2.jpg",
        "dog/d1.jpg",
        "dog/d2.jpg",
    ]
    assert [p["path"] for p in scan.problems] == ["dog/parent"]
