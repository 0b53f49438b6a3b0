"""The temporary folders of conversions (``convert.temp_folders``): a folder a killed process
left is swept by the next conversion; a live process's, and anything without our mark (other
tools' ``imgpack-*`` folders too), are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from convert import ConvertOptions, convert_folder
from convert.temp_folders import MARK, TempFolder, sweep_temp_folders
from readers import spec
from tests.photos import photo_folder

ROOT = Path(__file__).resolve().parent.parent
HOLDER = (
    "import sys, time\n"
    "from convert.temp_folders import TempFolder\n"
    "print(TempFolder(sys.argv[1], sys.argv[2]).path, flush=True)\n"
    "time.sleep(120)\n"
)


def hold_folder(kind: str, where: Path) -> tuple[subprocess.Popen, Path]:
    """A process holding a new temporary folder of ours, and the folder."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind, str(where)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    return process, Path(process.stdout.readline().strip())


def test_only_folders_of_ours_whose_process_died_are_swept(tmp_path):
    live, live_folder = hold_folder("prepared", tmp_path)
    killed, killed_folder = hold_folder("prepared", tmp_path)
    try:
        (killed_folder / "chunk.prepared").write_bytes(b"x" * 1000)
        killed.kill()
        killed.communicate()
        # imgpack-* folders of other tools (a test's Ray session, a benchmark's scratch),
        # a file, and another tool's folder: none has the mark, none is touched
        others = [tmp_path / "imgpack-ray-x1", tmp_path / "imgpack-ab-x2", tmp_path / "tool-x3"]
        for folder in others:
            (folder / "logs").mkdir(parents=True)
        a_file = tmp_path / "imgpack-notes.txt"
        a_file.write_text("a file, not a folder")
        marked_file = tmp_path / "imgpack-odd"
        marked_file.mkdir()
        (marked_file / MARK).mkdir()  # the mark must be a file

        assert sweep_temp_folders(str(tmp_path)) == [killed_folder]
        assert not killed_folder.exists()
        assert live_folder.is_dir()  # held by a live process
        assert all(folder.is_dir() for folder in others) and a_file.is_file()
        assert marked_file.is_dir()
    finally:
        live.kill()
        live.communicate()
    assert sweep_temp_folders(str(tmp_path)) == [live_folder]


def test_a_folder_this_process_holds_is_kept_until_it_removes_it(tmp_path):
    folder = TempFolder("source", str(tmp_path))
    assert sweep_temp_folders(str(tmp_path)) == []
    folder.remove()
    folder.remove()  # once is enough; again does nothing
    assert not Path(folder.path).exists() and "removed" in repr(folder)
    assert sweep_temp_folders(str(tmp_path)) == []


def test_the_spool_of_a_conversion_killed_mid_run_is_removed_by_the_next_run(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    photo_folder(src, 40, 96, 128)
    dst, temp = tmp_path / "dst", tmp_path / "tmp"
    temp.mkdir()
    release = tmp_path / "release"  # never made: the run stays held after its first shard
    command = [sys.executable, "-m", "tests.held_cli", "1", str(release), "convert"]
    command += [str(src), str(dst), "--format", "lmdb", "--shard-size", "10", "--workers", "2"]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while (
            not (dst / spec.JOURNAL_NAME).exists()
            or len((dst / spec.JOURNAL_NAME).read_text(encoding="utf-8").splitlines()) < 2
        ):
            assert process.poll() is None, "the conversion ended before its first shard"
            assert time.monotonic() < deadline, "the conversion made no progress"
            time.sleep(0.01)
        workers = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    while any(Path(f"/proc/{pid}").exists() for pid in workers):  # they die with it
        assert time.monotonic() < deadline, f"workers {workers} outlived the conversion"
        time.sleep(0.01)
    (spool,) = temp.glob("imgpack-prepared-*")  # what a SIGKILL leaves

    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    options = ConvertOptions("lmdb", shard_size=10)
    result = convert_folder(src, dst, options, workers=2, resume=True, progress=False)
    assert result.written == 40 and 10 <= result.resumed < 40  # it did resume
    assert not spool.exists()
    assert list(temp.iterdir()) == []  # and the resumed run's own folders are gone


@pytest.mark.parametrize("kind", ["prepared", "shard"])
def test_a_folder_made_is_named_by_kind_and_removed_whole(tmp_path, kind):
    made = TempFolder(kind, str(tmp_path))
    folder = Path(made.path)
    assert folder.name.startswith(f"imgpack-{kind}-") and folder.parent == tmp_path
    (folder / "inner").mkdir()
    (folder / "inner" / "file").write_bytes(b"data")
    made.remove()
    assert not folder.exists()
