"""The ``imgpack`` command line: conversions, ``info``, and clear refusals of user mistakes."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from convert.cli import main
from convert.cli.convert import parse_bytes
from readers import spec

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CLASSES = ["nature", "people", "scenes", "space"]
ERRORS_NAME = "errors.jsonl"


# --- helpers -------------------------------------------------------------------------------
def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def describe(result: Result) -> str:
    """What to show when an assertion on a CLI run fails."""
    return f"exit {result.exit_code}, exception {result.exception!r}\n{result.output}"


def assert_ok(result: Result) -> None:
    assert result.exit_code == 0, describe(result)


def assert_refused(result: Result, *patterns: str) -> None:
    """Non-zero exit through click (a message, not a traceback), naming each pattern."""
    assert result.exit_code != 0, describe(result)
    # An unexpected exception is stored as-is; click's own errors end in SystemExit.
    assert isinstance(result.exception, SystemExit), describe(result)
    assert "Traceback" not in result.output
    for pattern in patterns:
        assert re.search(pattern, result.output), f"{pattern!r} not in:\n{result.output}"


def read_manifest(root: Path) -> dict:
    return json.loads((root / spec.MANIFEST_NAME).read_text(encoding="utf-8"))


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``folder`` with its bytes and mtime."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cli_convert(tmp_path_factory, sample_data):
    """``cli_convert(fmt, *options)`` -> (dst, result): a CLI conversion of sample_data,
    run once per module for each distinct set of options."""
    cache: dict[tuple, tuple[Path, Result]] = {}

    def run(fmt: str, *options: object) -> tuple[Path, Result]:
        key = (fmt, *map(str, options))
        if key not in cache:
            dst = tmp_path_factory.mktemp(f"cli-{fmt}") / "out"
            result = invoke("convert", sample_data, dst, "--format", fmt, *options)
            assert_ok(result)
            cache[key] = dst, result
        return cache[key]

    return run


# --- converting each format, then `info` ---------------------------------------------------
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_convert_reports_written_and_skipped_and_info_describes_the_result(cli_convert, fmt):
    dst, result = cli_convert(fmt, "--encoding", "jpeg", "--resize", 64, "--workers", 2)
    assert "written 32, skipped 0" in result.output
    assert str(dst) in result.output
    manifest = read_manifest(dst)
    assert manifest["format"] == fmt
    assert manifest["written"] == 32
    for shard in manifest["shards"]:
        assert (dst / shard["path"]).exists()

    info = invoke("info", dst)
    assert_ok(info)
    text = info.output
    assert re.search(rf"^format\s+{fmt}\b", text, re.M), text
    assert re.search(r"^encoding\s+jpeg\b", text, re.M), text
    assert "32 written, 0 skipped" in text
    written_by = manifest["converted_with"]
    line = re.search(r"^written by (.*)$", text, re.M)
    assert line, text
    assert line[1] == (
        f"jpeg decoder {written_by['jpeg_decoder']}, "
        f"jpeg encoder {written_by['jpeg_encoder']}, 2 workers"  # restart markers or not
    )
    for name in SAMPLE_CLASSES:
        assert re.search(rf"^\s+{name}\s+8$", text, re.M), f"{name} count missing:\n{text}"
    for shard in manifest["shards"]:
        assert shard["path"] in text
        assert shard["path"].startswith(spec.SHARD_PREFIX)
    assert '"resize": 64' in text
    assert f'"format": "{fmt}"' in text
    assert '"quality": 90' in text
    assert manifest["content_sha256"] in text


@pytest.mark.parametrize("fmt", ["pt", "wds"])
def test_info_json_prints_the_manifest_itself(cli_convert, fmt):
    dst, _ = cli_convert(fmt, "--encoding", "jpeg", "--resize", 64, "--workers", 2)
    result = invoke("info", "--json", dst)
    assert_ok(result)
    assert json.loads(result.output) == read_manifest(dst)


# --- the real command, as a separate process ----------------------------------------------
def _console_script() -> str:
    beside_python = Path(sys.executable).parent / "imgpack"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("imgpack")
    if found is None:
        pytest.fail("the imgpack console script is not installed (pip install -e .)")
    return found


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False
    )


def test_python_dash_m_convert_cli_converts(tmp_path, sample_data):
    dst = tmp_path / "out"
    proc = _run(
        [
            sys.executable,
            "-m",
            "convert.cli",
            "convert",
            str(sample_data),
            str(dst),
            "--format",
            "hdf5",  # not pt: the process needs no torch (tests/test_cli_startup.py)
            "--encoding",
            "raw",
            "--resize",
            "48",
            "--center-crop",
            "48",
            "--workers",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "written 32, skipped 0" in proc.stdout
    assert (dst / spec.MANIFEST_NAME).is_file()
    assert (dst / spec.shard_name("hdf5", 0)).is_file()
    assert read_manifest(dst)["shape"] == [48, 48, 3]


def test_installed_console_script_converts_and_describes(tmp_path, sample_data):
    exe = _console_script()
    dst = tmp_path / "out"
    proc = _run(
        [
            exe,
            "convert",
            str(sample_data),
            str(dst),
            "--format",
            "wds",
            "--resize",
            "48",
            "--workers",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "written 32, skipped 0" in proc.stdout
    assert (dst / spec.MANIFEST_NAME).is_file()
    tar = dst / spec.shard_name("wds", 0)
    assert tar.is_file()
    assert Path(str(tar) + spec.WDS_INDEX_SUFFIX).is_file()

    info = _run([exe, "info", str(dst)])
    assert info.returncode == 0, info.stderr
    assert "wds" in info.stdout


def test_console_script_reports_a_mistake_without_traceback(tmp_path):
    proc = _run(
        [
            _console_script(),
            "convert",
            str(tmp_path / "missing"),
            str(tmp_path / "o"),
            "--format",
            "pt",
        ]
    )
    assert proc.returncode != 0
    assert "missing" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "o").exists()


# An imgpack command, then a request task that failed and was never collected, as a storage
# fault leaves in fsspec's event loop (aiohttp's "Cannot write to closing transport").
UNCOLLECTED_TASK = """
import asyncio, gc, sys
from convert.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except Exception:
    pass
async def send():
    raise ConnectionResetError("Cannot write to closing transport")
loop = asyncio.new_event_loop()
task = loop.create_task(send())
loop.run_until_complete(asyncio.sleep(0.01))
del task
gc.collect()
"""


def test_a_request_left_uncollected_by_a_fault_adds_no_traceback_without_debug(tmp_path):
    for debug in ((), ("--debug",)):
        argv = [sys.executable, "-c", UNCOLLECTED_TASK, *debug, "info", str(tmp_path / "no")]
        stderr = _run(argv).stderr
        assert ("Task exception was never retrieved" in stderr) == bool(debug), stderr
        assert ("Traceback" in stderr) == bool(debug), stderr


# --- user mistakes: a clear message, a non-zero exit, no traceback ------------------------
def test_missing_source_is_refused_naming_it(tmp_path):
    src = tmp_path / "no-such-folder"
    result = invoke("convert", src, tmp_path / "dst", "--format", "pt")
    assert_refused(result, re.escape(str(src)))
    assert not (tmp_path / "dst").exists()


def test_source_without_class_folders_is_refused(tmp_path, sample_data):
    src = tmp_path / "flat"
    src.mkdir()
    shutil.copy(sample_data / "nature" / "flower_00.jpg", src)
    result = invoke("convert", src, tmp_path / "dst", "--format", "pt")
    assert_refused(result, "class sub-folders", re.escape(str(src)))
    assert not (tmp_path / "dst").exists()


def test_class_folders_without_images_are_refused(tmp_path):
    src = tmp_path / "src"
    (src / "cats").mkdir(parents=True)
    (src / "dogs").mkdir()
    (src / "dogs" / "notes.txt").write_text("no images here")
    result = invoke("convert", src, tmp_path / "dst", "--format", "wds")
    assert_refused(result, "no images found")
    assert not (tmp_path / "dst").exists()


def test_non_empty_destination_is_refused_and_left_untouched(tmp_path, sample_data):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "thesis.tex").write_text("years of work")
    (dst / "data").mkdir()
    (dst / "data" / "results.csv").write_text("1,2,3")
    before = snapshot(dst)
    result = invoke("convert", sample_data, dst, "--format", "pt", "--workers", 2)
    assert_refused(result, "not empty", "--overwrite")
    assert snapshot(dst) == before


def test_destination_that_is_a_file_is_refused(tmp_path, sample_data):
    dst = tmp_path / "dst"
    dst.write_text("a file")
    result = invoke("convert", sample_data, dst, "--format", "pt")
    assert_refused(result, "not a folder")
    assert dst.read_text() == "a file"


WDS_48 = ("--format", "wds", "--resize", 48, "--workers", 2)


def test_overwrite_replaces_an_earlier_imgpack_dataset(tmp_path, sample_data):
    dst = tmp_path / "dst"
    first = invoke(
        "convert",
        sample_data,
        dst,
        "--format",
        "pt",
        "--resize",
        48,
        "--shard-size",
        10,
        "--workers",
        2,
    )
    assert_ok(first)
    assert len(read_manifest(dst)["shards"]) == 4

    second = invoke("convert", sample_data, dst, *WDS_48, "--overwrite")
    assert_ok(second)
    manifest = read_manifest(dst)
    assert manifest["format"] == "wds"
    expected = {spec.MANIFEST_NAME, *(s["path"] for s in manifest["shards"])}
    expected |= {s["path"] + spec.WDS_INDEX_SUFFIX for s in manifest["shards"]}
    assert {p.name for p in dst.iterdir()} == expected  # no .pt shard left over


def test_overwrite_refuses_a_folder_with_foreign_files(tmp_path, sample_data):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "family-photo.jpg").write_bytes(b"precious")
    (dst / "shard-000000.pt").write_bytes(b"looks like ours")
    before = snapshot(dst)
    result = invoke("convert", sample_data, dst, "--format", "pt", "--overwrite")
    assert_refused(result, "did not write")
    assert snapshot(dst) == before


def test_overwrite_keeps_foreign_files_beside_an_imgpack_dataset(tmp_path, sample_data):
    # A dataset folder where the user also keeps a file of their own: replacing the
    # dataset must not delete what imgpack did not write.
    dst = tmp_path / "dst"
    assert_ok(invoke("convert", sample_data, dst, *WDS_48))
    (dst / "README-my-notes.md").write_text("how I made this dataset")
    result = invoke("convert", sample_data, dst, *WDS_48, "--overwrite")
    assert (dst / "README-my-notes.md").exists(), (
        "--overwrite deleted a file imgpack did not write\n" + describe(result)
    )


@pytest.mark.parametrize(
    ("options", "patterns"),
    [
        pytest.param(
            ["--format", "pt", "--encoding", "original", "--resize", "64"],
            ["original", "--resize"],
            id="original-with-resize",
        ),
        pytest.param(
            ["--format", "pt", "--encoding", "original", "--center-crop", "64"],
            ["original", "--center-crop"],
            id="original-with-crop",
        ),
        pytest.param(
            ["--format", "pt", "--compression", "gzip"],
            ["--compression", "hdf5"],
            id="compression-without-hdf5",
        ),
        pytest.param(
            ["--format", "pt", "--quality", "0"], ["quality", "1 and 100"], id="quality-0"
        ),
        pytest.param(["--format", "pt", "--quality", "101"], ["quality"], id="quality-101"),
        pytest.param(["--format", "pt", "--resize", "0"], ["resize"], id="resize-0"),
        pytest.param(
            ["--format", "pt", "--shard-size", "-3"], ["shard-size"], id="shard-size-negative"
        ),
        pytest.param(
            ["--format", "wds", "--shard-bytes", "bogus"],
            ["bogus", "512MB"],
            id="shard-bytes-bogus",
        ),
        pytest.param(
            ["--format", "wds", "--shard-bytes", "5ib"], ["5ib"], id="shard-bytes-bad-unit"
        ),
        pytest.param(["--format", "parquet"], ["parquet"], id="unknown-format"),
        pytest.param(["--format", "pt", "--encoding", "avif"], ["avif"], id="unknown-encoding"),
        pytest.param(
            ["--format", "hdf5", "--compression", "zstd"], ["zstd"], id="unknown-compression"
        ),
        pytest.param([], ["--format"], id="format-missing"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(
    tmp_path, sample_data, options, patterns
):
    dst = tmp_path / "dst"
    result = invoke("convert", sample_data, dst, *options)
    assert_refused(result, *map(re.escape, patterns))
    assert not dst.exists()


def test_info_on_a_folder_that_is_not_a_dataset_is_refused(tmp_path):
    (tmp_path / "holiday.jpg").write_bytes(b"x")
    result = invoke("info", tmp_path)
    assert_refused(result, "not an imgpack dataset", re.escape(str(tmp_path)))
    assert_refused(invoke("info", "--json", tmp_path), "not an imgpack dataset")


def test_info_on_a_missing_folder_is_refused(tmp_path):
    assert_refused(invoke("info", tmp_path / "gone"), "gone")


def test_info_on_a_corrupt_manifest_is_refused(tmp_path):
    (tmp_path / spec.MANIFEST_NAME).write_text("{not json")
    assert_refused(invoke("info", tmp_path), re.escape(spec.MANIFEST_NAME))


# --- shards --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["wds", "pt"])
def test_shard_size_splits_32_samples_into_4_shards(cli_convert, fmt):
    dst, _ = cli_convert(fmt, "--resize", 48, "--shard-size", 10, "--workers", 2)
    shards = read_manifest(dst)["shards"]
    assert [s["samples"] for s in shards] == [10, 10, 10, 2]
    assert [s["path"] for s in shards] == [spec.shard_name(fmt, i) for i in range(4)]
    assert all((dst / s["path"]).is_file() for s in shards)


@pytest.mark.parametrize("fmt", ["wds", "pt"])
def test_shard_bytes_starts_a_new_shard_before_the_limit(cli_convert, sample_data, fmt):
    limit = 100_000
    dst, _ = cli_convert(fmt, "--encoding", "original", "--shard-bytes", "100KB", "--workers", 2)
    manifest = read_manifest(dst)
    assert manifest["options"]["shard_bytes"] == limit
    # --encoding original stores each source file as-is, in scan order.
    sizes = [
        (sample_data / c / name).stat().st_size
        for c in SAMPLE_CLASSES
        for name in sorted(os.listdir(sample_data / c))
    ]
    shards = manifest["shards"]
    assert len(shards) >= 5
    assert sum(s["samples"] for s in shards) == len(sizes) == 32
    start = 0
    for k, shard in enumerate(shards):
        own = sizes[start : start + shard["samples"]]
        assert own, f"shard {k} is empty"
        # Under the limit, unless a single sample is larger than it...
        assert sum(own) <= limit or len(own) == 1, (k, own)
        # ...and the file is under the limit plus one sample (container overhead included).
        assert shard["bytes"] < limit + max(own), (k, shard["bytes"], own)
        start += shard["samples"]
        if start < len(sizes):  # not closed early: the next sample would not have fitted
            assert sum(own) + sizes[start] > limit, (k, own, sizes[start])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000", 1000),
        ("512MB", 512_000_000),
        ("512mb", 512_000_000),
        ("100KB", 100_000),
        ("100k", 100_000),
        ("1GiB", 2**30),
        ("64KiB", 65_536),
        ("2 GB", 2_000_000_000),
        ("1.5GB", 1_500_000_000),
        ("3T", 3 * 10**12),
        ("512B", 512),
        ("7b", 7),
    ],
)
def test_parse_bytes_understands_decimal_and_binary_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["bogus", "", "MB", "-5MB", "12XB", "1ib", "5i", "1 0MB"])
def test_parse_bytes_refuses_what_is_not_a_size_with_a_click_error(text):
    with pytest.raises(click.BadParameter):
        parse_bytes(text)


# --- help ----------------------------------------------------------------------------------
def test_convert_help_mentions_every_format_and_encoding():
    result = invoke("convert", "--help")
    assert_ok(result)
    for name in (*spec.FORMATS, *spec.ENCODINGS):
        assert name in result.output, name
    for option in (
        "--resize",
        "--center-crop",
        "--shard-size",
        "--shard-bytes",
        "--workers",
        "--shuffle",
        "--overwrite",
    ):
        assert option in result.output


def test_top_level_help_lists_the_commands_and_version_works():
    result = invoke("--help")
    assert_ok(result)
    assert "convert" in result.output and "info" in result.output
    version = invoke("--version")
    assert_ok(version)
    assert "imgpack" in version.output


# --- bad images among good ones ------------------------------------------------------------
def _copy_of_sample_data(sample_data: Path, dst: Path) -> Path:
    shutil.copytree(sample_data, dst, ignore=shutil.ignore_patterns("*.md"))
    return dst


def _add_non_images(src: Path) -> None:
    (src / "nature" / "notes.txt").write_text("not an image")
    (src / "people" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (src / "notes.txt").write_text("beside the class folders")


def _random_bytes_jpg(src: Path) -> str:
    rng = random.Random(7)
    (src / "nature" / "noise.jpg").write_bytes(b"\x00" + rng.randbytes(4000))
    return "nature/noise.jpg"


def _empty_jpg(src: Path) -> str:
    (src / "people" / "empty.jpg").write_bytes(b"")
    return "people/empty.jpg"


def _truncated_jpg(src: Path) -> str:
    data = (src / "scenes" / "china_00.jpg").read_bytes()
    (src / "scenes" / "truncated.jpg").write_bytes(data[: len(data) // 2])
    return "scenes/truncated.jpg"


def _check_skipped(dst: Path, result: Result, bad: set[str]) -> None:
    assert f"written 32, skipped {len(bad)}" in result.output, describe(result)
    assert ERRORS_NAME in result.stderr
    manifest = read_manifest(dst)
    assert manifest["skipped"] == len(bad)
    assert manifest["written"] == 32
    assert manifest["errors_file"] == ERRORS_NAME
    assert manifest["samples_per_class"] == dict.fromkeys(SAMPLE_CLASSES, 8)
    lines = (dst / ERRORS_NAME).read_text(encoding="utf-8").splitlines()
    errors = [json.loads(line) for line in lines]
    assert {e["path"] for e in errors} == bad
    assert len(errors) == len(bad)
    for e in errors:
        assert isinstance(e["error"], str) and len(e["error"]) > len(e["path"]), e


def test_undecodable_files_are_skipped_and_listed_but_non_images_ignored(tmp_path, sample_data):
    src = _copy_of_sample_data(sample_data, tmp_path / "src")
    _add_non_images(src)
    bad = {_random_bytes_jpg(src), _empty_jpg(src)}
    dst = tmp_path / "dst"
    result = invoke("convert", src, dst, "--format", "wds", "--resize", 48, "--workers", 2)
    assert_ok(result)
    _check_skipped(dst, result, bad)
    errors = [json.loads(x) for x in (dst / ERRORS_NAME).read_text().splitlines()]
    assert any("empty" in e["error"] for e in errors if e["path"] == "people/empty.jpg")
    assert_ok(info := invoke("info", dst))
    assert "32 written, 2 skipped" in info.output


def test_random_empty_and_truncated_jpegs_are_all_skipped(tmp_path, sample_data):
    src = _copy_of_sample_data(sample_data, tmp_path / "src")
    _add_non_images(src)
    bad = {_random_bytes_jpg(src), _empty_jpg(src), _truncated_jpg(src)}
    dst = tmp_path / "dst"
    result = invoke("convert", src, dst, "--format", "pt", "--resize", 48, "--workers", 2)
    assert_ok(result)
    _check_skipped(dst, result, bad)


def test_a_source_of_only_bad_images_fails_and_lists_them(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.jpg").write_bytes(b"")
    (src / "a" / "y.png").write_bytes(b"not a png")
    dst = tmp_path / "dst"
    result = invoke("convert", src, dst, "--format", "pt", "--workers", 1)
    assert_refused(result, "no image could be converted", ERRORS_NAME)
    # The message sends the user to errors.jsonl: it must exist and list both files.
    errors_file = dst / ERRORS_NAME
    assert errors_file.is_file(), f"message points to {errors_file}, which was not written"
    paths = {json.loads(x)["path"] for x in errors_file.read_text().splitlines()}
    assert paths == {"a/x.jpg", "a/y.png"}


def test_on_error_fail_exits_naming_the_file_and_resume_finishes_once_it_is_fixed(
    tmp_path, sample_data
):
    src = _copy_of_sample_data(sample_data, tmp_path / "src")
    bad = _truncated_jpg(src)
    dst = tmp_path / "dst"
    args = ("convert", src, dst, "--format", "wds", "--resize", 48, "--shard-size", 4)
    failed = invoke(*args, "--on-error", "fail", "--workers", 2)
    assert_refused(failed, bad, "truncated", "--on-error fail", "--resume")
    assert not (dst / spec.MANIFEST_NAME).exists()
    (src / bad).unlink()
    resumed = invoke(*args, "--on-error", "fail", "--workers", 2, "--resume")
    assert_ok(resumed)
    assert "kept 20 from the interrupted run" in resumed.output  # the 5 shards before it
    fresh = tmp_path / "fresh"
    assert_ok(invoke("convert", src, fresh, *args[3:], "--workers", 1))
    assert read_manifest(dst)["content_sha256"] == read_manifest(fresh)["content_sha256"]


def test_resume_redoes_the_shards_whose_source_files_changed(tmp_path, sample_data):
    src = _copy_of_sample_data(sample_data, tmp_path / "src")
    bad = _truncated_jpg(src)  # in "scenes", the third class: shards 0-3 come before it
    dst = tmp_path / "dst"
    args = ("convert", src, dst, "--format", "pt", "--resize", 32, "--shard-size", 4)
    assert_refused(invoke(*args, "--on-error", "fail"), bad)
    (src / bad).unlink()
    gone = sorted((src / "people").iterdir())[5]  # sample 13, in shard 3
    gone.unlink()
    resumed = invoke(*args, "--resume")
    assert_ok(resumed)
    assert "kept 12 from the interrupted run" in resumed.output  # shards 0-2 only
    fresh = tmp_path / "fresh"
    assert_ok(invoke("convert", src, fresh, *args[3:]))
    assert read_manifest(dst)["content_sha256"] == read_manifest(fresh)["content_sha256"]
    assert read_manifest(dst)["shards"] == read_manifest(fresh)["shards"]


def test_max_pixels_skips_larger_images_naming_the_limit(cli_convert):
    dst, result = cli_convert("pt", "--resize", 32, "--max-pixels", 150_000, "--workers", 2)
    lines = (dst / ERRORS_NAME).read_text(encoding="utf-8").splitlines()
    errors = [json.loads(line) for line in lines]
    assert errors and all("decompression-bomb limit of 150,000" in e["error"] for e in errors)
    assert f"skipped {len(errors)}" in result.output
    assert read_manifest(dst)["options"]["max_pixels"] == 150_000


def test_resume_and_overwrite_together_are_refused(tmp_path, sample_data):
    result = invoke(
        "convert", sample_data, tmp_path / "d", "--format", "pt", "--resume", "--overwrite"
    )
    assert_refused(result, "exclude each other")
    assert not (tmp_path / "d").exists()


def test_verify_help_says_what_it_checks_and_the_exit_status():
    result = invoke("verify", "--help")
    assert_ok(result)
    for words in ("SHA-256", "--deep", "exits", "status 1"):
        assert words in result.output


# --- determinism ---------------------------------------------------------------------------
@pytest.mark.parametrize("order", [(), ("--shuffle", "--seed", 3)], ids=["sorted", "shuffled"])
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_worker_count_changes_nothing_in_the_files(cli_convert, fmt, order):
    # Byte-identical in every format: tar members with fixed metadata, HDF5 without
    # timestamps, LMDB pages zeroed before use, torch.save's zip without timestamps.
    one, _ = cli_convert(fmt, "--resize", 48, "--shard-size", 20, *order, "--workers", 1)
    two, _ = cli_convert(fmt, "--resize", 48, "--shard-size", 20, *order, "--workers", 2)
    m1, m2 = read_manifest(one), read_manifest(two)
    assert m1["converted_with"]["workers"] == 1
    assert m2["converted_with"]["workers"] == 2
    assert m1["content_sha256"] == m2["content_sha256"]
    assert m1["shards"] == m2["shards"]
    assert len(m1["shards"]) == 2
    for s in m1["shards"]:
        assert sha256_of(one / s["path"]) == sha256_of(two / s["path"]), s["path"]


def test_worker_count_keeps_the_content_checksum_for_pt_raw(cli_convert):
    options = ("--encoding", "raw", "--resize", 48)
    one, _ = cli_convert("pt", *options, "--workers", 1)
    two, _ = cli_convert("pt", *options, "--workers", 2)
    assert read_manifest(one)["content_sha256"] == read_manifest(two)["content_sha256"]


def _wds_paths(root: Path) -> list[str]:
    paths = []
    for shard in read_manifest(root)["shards"]:
        index = json.loads((root / (shard["path"] + spec.WDS_INDEX_SUFFIX)).read_text())
        paths += index["paths"]
    return paths


def test_shuffle_with_a_seed_is_reproducible_and_keeps_every_sample(
    cli_convert, tmp_path, sample_data
):
    options = ("--resize", 48, "--workers", 2)
    plain, _ = cli_convert("wds", *options)
    shuffled, _ = cli_convert("wds", *options, "--shuffle", "--seed", 3)
    again = tmp_path / "again"
    assert_ok(
        invoke("convert", sample_data, again, "--format", "wds", *options, "--shuffle", "--seed", 3)
    )
    other_seed, _ = cli_convert("wds", *options, "--shuffle", "--seed", 4)

    m_plain, m_shuf = read_manifest(plain), read_manifest(shuffled)
    m_again, m_other = read_manifest(again), read_manifest(other_seed)
    assert m_shuf["content_sha256"] == m_again["content_sha256"]
    assert m_shuf["shards"] == m_again["shards"]  # same bytes, same files
    assert m_shuf["samples_per_class"] == m_plain["samples_per_class"]
    assert m_shuf["options"]["shuffle"] is True and m_shuf["options"]["seed"] == 3

    # Shuffled: the same samples in another order, a different order for another seed.
    assert sorted(_wds_paths(shuffled)) == sorted(_wds_paths(plain))
    assert _wds_paths(shuffled) != _wds_paths(plain)
    assert _wds_paths(other_seed) != _wds_paths(shuffled)
    assert m_shuf["content_sha256"] != m_plain["content_sha256"]
    assert m_other["content_sha256"] not in (m_shuf["content_sha256"], m_plain["content_sha256"])
    assert m_other["samples_per_class"] == m_plain["samples_per_class"]
