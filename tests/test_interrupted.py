"""Interrupted and concurrent conversions: SIGKILL, Ctrl-C and SIGTERM mid-shard, a full
disk, a second run into the same folder, and ``--resume`` after each.

The conversions killed or signalled here are real ``imgpack convert`` subprocesses, stopped
part-way through; a resumed dataset must have the content checksum of an uninterrupted run
(and, where the format allows, the very same bytes). What needs no process of its own (a
resume, a refusal: the CLI's own code and messages) runs the same command in this process
through click's runner, which sees its exit code and its stdout and stderr apart: a
subprocess would only add an import of torch (2 CPU-seconds) to each.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.verify import verify_dataset
from readers import spec
from readers.manifest import load_manifest
from tests.photos import photo_folder

ROOT = Path(__file__).resolve().parent.parent
IMAGES = 120
SHARD = 10
# Slow enough per image (decode, resize, encode of a 256x192 photo) to be caught mid-run.
ARGS = ["--encoding", "jpeg", "--resize", "128", "--shard-size", str(SHARD)]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("interrupted-src"), IMAGES, 192, 256)


@pytest.fixture(scope="module")
def reference(source: Path, tmp_path_factory: pytest.TempPathFactory):
    """``reference(fmt)``: the manifest and shard bytes of an uninterrupted conversion."""
    cache: dict[str, tuple[dict, dict[str, bytes]]] = {}

    def build(fmt: str) -> tuple[dict, dict[str, bytes]]:
        if fmt not in cache:
            dst = tmp_path_factory.mktemp(f"reference-{fmt}")
            convert_folder(source, dst, options(fmt), workers=1, progress=False)
            cache[fmt] = (manifest_of(dst), shard_bytes(dst))
        return cache[fmt]

    return build


def options(fmt: str) -> ConvertOptions:
    """The options ARGS give on the command line."""
    return ConvertOptions(format=fmt, encoding="jpeg", resize=128, shard_size=SHARD)


def cli_args(src: Path, dst: Path, fmt: str, *extra: str) -> list[str]:
    """The arguments of ``imgpack`` for the conversion."""
    return ["convert", str(src), str(dst), "--format", fmt, *ARGS, "--workers", "2", *extra]


def command(src: Path, dst: Path, fmt: str, *extra: str, held_at: int) -> list[str]:
    """The conversion's command line, held still once ``held_at`` shards are journaled,
    until :func:`release` (``tests/held_cli.py``), so no test races the run."""
    held = [sys.executable, "-m", "tests.held_cli", str(held_at), str(release_file(dst))]
    return [*held, *cli_args(src, dst, fmt, *extra)]


def release_file(dst: Path) -> Path:
    return dst.with_name(dst.name + ".release")


def release(dst: Path) -> None:
    """Let a conversion started with ``held_at=`` go on."""
    release_file(dst).touch()


def run_cli(src: Path, dst: Path, fmt: str, *extra: str) -> Result:
    """The conversion run to its end in this process (a resume, a refusal); its
    ``exit_code``, ``stdout`` and ``stderr`` are the command's. An exception it let through
    (a traceback for its user) fails the test."""
    result = CliRunner().invoke(main, cli_args(src, dst, fmt, *extra))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@contextlib.contextmanager
def start_cli(
    src: Path, dst: Path, fmt: str, *extra: str, held_at: int
) -> Iterator[subprocess.Popen]:
    """A running conversion that stops still once ``held_at`` shards are journaled (see
    :func:`command`), killed on the way out if it is still running (a hung one fails its
    test at its timeout instead of blocking the suite in ``Popen.wait``)."""
    release_file(dst).unlink(missing_ok=True)
    process = subprocess.Popen(
        command(src, dst, fmt, *extra, held_at=held_at),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()  # its workers follow it (PR_SET_PDEATHSIG)
        process.communicate()


def manifest_of(dst: Path) -> dict:
    return json.loads((dst / spec.MANIFEST_NAME).read_text(encoding="utf-8"))


def shard_bytes(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.glob(spec.SHARD_PREFIX + "*"))}


def completed_shards(dst: Path) -> int:
    """Shards the running conversion has journaled so far."""
    try:
        lines = (dst / spec.JOURNAL_NAME).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    return max(0, len(lines) - 1)


def wait_for_shards(process: subprocess.Popen, dst: Path, count: int) -> None:
    """Block until the conversion has completed ``count`` shards (and is still running)."""
    deadline = time.monotonic() + 120
    while completed_shards(dst) < count:
        assert process.poll() is None, f"conversion ended early: {process.communicate()}"
        assert time.monotonic() < deadline, "conversion made no progress"
        time.sleep(0.005)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def assert_same_as_reference(dst: Path, reference_manifest: dict, reference_shards: dict) -> None:
    manifest = manifest_of(dst)
    assert manifest["content_sha256"] == reference_manifest["content_sha256"]
    assert manifest["shards"] == reference_manifest["shards"]
    assert shard_bytes(dst) == reference_shards
    assert not (dst / spec.JOURNAL_NAME).exists() and not (dst / spec.LOCK_NAME).exists()
    assert verify_dataset(dst, deep=True, progress=False).ok


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_resume_after_sigkill_mid_shard_equals_an_uninterrupted_run(
    source, reference, fmt, tmp_path
):
    ref_manifest, ref_shards = reference(fmt)
    dst = tmp_path / "dst"
    with start_cli(source, dst, fmt, held_at=3) as process:
        wait_for_shards(process, dst, 3)
        workers = children(process.pid)
        process.send_signal(signal.SIGKILL)
    assert not (dst / spec.MANIFEST_NAME).exists()
    with pytest.raises(spec.DatasetError, match=r"incomplete conversion.*--resume"):
        load_manifest(dst)
    # The workers die with the main process: nothing is left writing or holding memory.
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]

    done = run_cli(source, dst, fmt, "--resume")
    assert done.exit_code == 0, done.stderr
    kept = int(done.stdout.split("kept ")[1].split()[0])
    assert 3 * SHARD <= kept < IMAGES, done.stdout  # completed shards were not redone
    assert_same_as_reference(dst, ref_manifest, ref_shards)


def test_a_worker_killed_mid_run_stops_the_run_resumably_instead_of_hanging(
    source, reference, tmp_path
):
    ref_manifest, ref_shards = reference("lmdb")
    dst = tmp_path / "dst"
    with start_cli(source, dst, "lmdb", held_at=1) as process:
        wait_for_shards(process, dst, 1)
        os.kill(children(process.pid)[0], signal.SIGKILL)  # as the OOM killer does
        release(dst)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert "worker process died" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    done = run_cli(source, dst, "lmdb", "--resume")
    assert done.exit_code == 0, done.stderr
    assert_same_as_reference(dst, ref_manifest, ref_shards)


# Prepares the photos in DIR (argv[1]) over and over, ATTEMPTS (argv[2]) times, each in a
# pool of its own; prints "died" for each attempt that ends in WorkerDiedError.
KILLED_WHILE_SENDING = """
import sys
from pathlib import Path
from convert.executors.pool import WorkerDiedError, prepared_in_order
from convert.process import Transform
from convert.scan import Sample
from convert.sources import FolderReader
src = Path(sys.argv[1])
files = sorted(str(p.relative_to(src)) for p in src.rglob("*.jpg")) * 20
samples = [Sample(f, 0) for f in files]
transform = Transform("raw", 512, None, 90, True, None)
for _ in range(int(sys.argv[2])):
    try:
        for _ in prepared_in_order(FolderReader(str(src)), samples, transform, 2):
            pass
    except WorkerDiedError:
        print("died", flush=True)
    else:
        print("finished", flush=True)
"""


def test_a_worker_killed_while_sending_its_results_never_hangs_the_pool(source):
    # Chunks of 512 px raw pixels are megabytes: killed mid-send, a worker used to leave a
    # half-written message in the pool's result pipe, and its reader thread waited for the
    # rest forever (about 1 kill in 7 hung). Now only a file name crosses the pipe. Each
    # attempt is a new pool in the same process (one import of torch for all of them).
    attempts = 6
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_SENDING, str(source), str(attempts)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in process.stdout], daemon=True)
    reader.start()
    try:
        for attempt in range(attempts):
            deadline = time.monotonic() + 60
            while len(children(process.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1 + 0.15 * attempt)  # at a different point of the work each time
            os.kill(children(process.pid)[attempt % 2], signal.SIGKILL)
            try:
                said = lines.get(timeout=60)
            except queue.Empty:
                pytest.fail(f"attempt {attempt}: the pool hung after its worker was killed")
            assert said == "died\n", f"attempt {attempt}: {said}"
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
        process.wait()
        reader.join(timeout=30)  # to the end of stdout (the workers die with the process)
        process.stdout.close()
        process.stderr.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_exits_cleanly_saying_how_to_resume(source, reference, sig, tmp_path):
    ref_manifest, ref_shards = reference("wds")
    dst = tmp_path / "dst"
    with start_cli(source, dst, "wds", held_at=2) as process:
        wait_for_shards(process, dst, 2)
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted" in stderr and "--resume" in stderr
    assert re.search(r"interrupted: [1-9]\d* shard\(s\) with [1-9]\d* samples are complete", stderr)
    assert not (dst / spec.MANIFEST_NAME).exists()
    assert not list(dst.glob(spec.TMP_PREFIX + "*"))  # the partial shard is cleaned up
    done = run_cli(source, dst, "wds", "--resume")
    assert done.exit_code == 0, done.stderr
    assert_same_as_reference(dst, ref_manifest, ref_shards)


def test_a_second_conversion_into_the_same_folder_is_refused_and_the_first_is_unharmed(
    source, reference, tmp_path
):
    ref_manifest, ref_shards = reference("lmdb")  # (a format whose writer needs no torch)
    dst = tmp_path / "dst"
    with start_cli(source, dst, "lmdb", "--workers", "1", held_at=1) as first:
        wait_for_shards(first, dst, 1)
        for flags in ([], ["--resume"], ["--overwrite"]):
            second = run_cli(source, dst, "lmdb", *flags)
            assert second.exit_code != 0
            assert "another imgpack convert" in second.output, second.output
            assert f"pid {first.pid}" in second.output
        assert first.poll() is None  # still running
        release(dst)
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert_same_as_reference(dst, ref_manifest, ref_shards)


# Holds the lock on DST (argv[1]) until its stdin closes, as a running conversion does.
HOLD_LOCK = (
    "import sys; from pathlib import Path; from convert.output.lock import DestinationLock; "
    "DestinationLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); "
    "sys.stdin.read()"
)


def test_a_busy_or_non_empty_dst_is_refused_before_the_source_is_scanned(tmp_path):
    missing = tmp_path / "no-such-source"  # scanning it would be the error
    full = tmp_path / "full"
    full.mkdir()
    (full / spec.MANIFEST_NAME).write_text("{}")
    refused = run_cli(missing, full, "pt")
    assert refused.exit_code == 1
    assert "folder is not empty (holds a dataset)" in refused.stderr, refused.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(busy)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        for flags in ([], ["--resume"], ["--overwrite"]):
            refused = run_cli(missing, busy, "pt", *flags)
            assert refused.exit_code == 1
            assert f"another imgpack convert (pid {holder.pid})" in refused.stderr
    finally:
        holder.communicate(timeout=30)  # closes its stdin: it lets go
    # The source is scanned once the DST is claimed; a DST made for a failed run is removed.
    fresh = tmp_path / "fresh"
    failed = run_cli(missing, fresh, "pt")
    assert "source folder does not exist" in failed.stderr, failed.stderr
    assert not fresh.exists()


def test_resume_refuses_other_options_naming_what_changed(source, tmp_path):
    dst = tmp_path / "dst"
    with start_cli(source, dst, "wds", held_at=1) as process:
        wait_for_shards(process, dst, 1)
        process.kill()
    done = run_cli(source, dst, "wds", "--resume", "--quality", "75")
    assert done.exit_code != 0
    assert "cannot resume: quality 90 -> 75" in done.stderr


def test_resume_of_a_dataset_recorded_before_restart_markers_names_the_option(source, tmp_path):
    # a manifest written before --restart-markers existed: its JPEGs have none
    dst = tmp_path / "dst"
    assert run_cli(source, dst, "wds").exit_code == 0
    manifest = json.loads((dst / spec.MANIFEST_NAME).read_text())
    del manifest["options"]["restart_markers"]
    (dst / spec.MANIFEST_NAME).write_text(json.dumps(manifest))
    done = run_cli(source, dst, "wds", "--resume")
    assert done.exit_code != 0
    assert "cannot resume: restart-markers False -> True" in done.stderr, done.stderr
    done = run_cli(source, dst, "wds", "--resume", "--no-restart-markers")
    assert done.exit_code == 0, done.stderr
    assert "already complete" in done.stdout


def test_resume_of_a_complete_dataset_does_nothing(source, reference, tmp_path):
    ref_manifest, _ = reference("wds")
    dst = tmp_path / "dst"
    assert run_cli(source, dst, "wds").exit_code == 0
    before = shard_bytes(dst)
    done = run_cli(source, dst, "wds", "--resume")
    assert done.exit_code == 0, done.stderr
    assert "already complete" in done.stdout
    assert shard_bytes(dst) == before
    assert manifest_of(dst)["content_sha256"] == ref_manifest["content_sha256"]


# --- a full disk -----------------------------------------------------------------------------
def _mount_tmpfs(folder: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.parametrize("disk_kind", ["tmpfs", "injected"])
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_disk_full_gives_a_clear_error_and_resume_completes_once_space_is_free(
    source, reference, fmt, disk_kind, tmp_path, monkeypatch
):
    """A real full filesystem (a 512 KiB tmpfs, where the test may mount one: root), and the
    error injected at the shard writer's write call (everywhere)."""
    ref_manifest, ref_shards = reference(fmt)
    disk = tmp_path / "disk"
    if disk_kind == "tmpfs" and not _mount_tmpfs(disk, "512k"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the injected case runs")
    try:
        if disk_kind == "injected":
            _inject_enospc(monkeypatch, fmt, after=3 * SHARD + 5)
        with pytest.raises(OSError) as caught:
            convert_folder(source, disk / "dst", options(fmt), workers=2, progress=False)
        assert caught.value.errno == errno.ENOSPC
        assert "no space left on device" in str(caught.value) and "--resume" in str(caught.value)
        assert not (disk / "dst" / spec.MANIFEST_NAME).exists()
        assert not list((disk / "dst").glob(spec.TMP_PREFIX + "*"))
        if disk_kind == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        else:
            monkeypatch.undo()
        result = convert_folder(
            source, disk / "dst", options(fmt), workers=2, resume=True, progress=False
        )
        assert result.resumed >= SHARD
        assert_same_as_reference(disk / "dst", ref_manifest, ref_shards)
    finally:
        if disk_kind == "tmpfs":
            subprocess.run(["umount", "--lazy", str(disk)], check=True)  # readers may hold maps


def _inject_enospc(monkeypatch: pytest.MonkeyPatch, fmt: str, after: int) -> None:
    """Make the ``after``-th record written fail as a full disk does."""
    from convert import writers

    real_writer = writers.WRITERS[fmt]
    count = 0

    class FullDisk:
        def __init__(self, path, layout):
            self.inner = real_writer(path, layout)

        def add(self, record):
            nonlocal count
            count += 1
            if count >= after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.inner.add(record)

        def close(self):
            return self.inner.close()

    monkeypatch.setitem(writers.WRITERS, fmt, FullDisk)


# --- what a resume keeps ---------------------------------------------------------------------
def test_a_run_killed_twice_resumes_twice_to_the_uninterrupted_result(source, reference, tmp_path):
    ref_manifest, ref_shards = reference("wds")
    dst = tmp_path / "dst"
    for shards in (2, 6):  # the second run is itself a resume, killed further on
        with start_cli(source, dst, "wds", "--resume", held_at=shards) as process:
            wait_for_shards(process, dst, shards)
            process.kill()
    assert completed_shards(dst) >= 6
    done = run_cli(source, dst, "wds", "--resume")
    assert done.exit_code == 0, done.stderr
    assert_same_as_reference(dst, ref_manifest, ref_shards)


def stopped_at_record(source: Path, dst: Path, fmt: str, monkeypatch, record: int) -> None:
    """An in-process conversion into ``dst`` that fails at its ``record``-th sample."""
    _inject_enospc(monkeypatch, fmt, after=record)
    with pytest.raises(OSError):
        convert_folder(source, dst, options(fmt), workers=2, progress=False)
    monkeypatch.undo()


def test_resume_redoes_a_completed_shard_changed_since_and_all_after_it(
    source, reference, tmp_path, monkeypatch
):
    dst = tmp_path / "dst"
    stopped_at_record(source, dst, "pt", monkeypatch, 4 * SHARD + 3)
    damaged = dst / spec.shard_name("pt", 2)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    damaged.write_bytes(data)
    result = convert_folder(source, dst, options("pt"), workers=2, resume=True, progress=False)
    assert result.resumed == 2 * SHARD  # shards 0 and 1 kept; 2 and 3 redone
    assert_same_as_reference(dst, *reference("pt"))


def test_a_journal_line_torn_by_a_kill_is_ignored_and_its_shard_redone(
    source, reference, tmp_path, monkeypatch
):
    dst = tmp_path / "dst"
    stopped_at_record(source, dst, "lmdb", monkeypatch, 3 * SHARD + 3)
    journal = dst / spec.JOURNAL_NAME
    text = journal.read_text(encoding="utf-8")
    journal.write_text(text[: len(text) - 100], encoding="utf-8")  # the last entry, cut short
    result = convert_folder(source, dst, options("lmdb"), workers=2, resume=True, progress=False)
    assert result.resumed == 2 * SHARD
    assert_same_as_reference(dst, *reference("lmdb"))


def test_a_stale_lock_file_is_taken_over_once_without_leaking_a_descriptor(tmp_path):
    from convert.output.destination import claim_destination

    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / spec.LOCK_NAME).write_text("999999\n")  # left by a run that was killed
    (dst / spec.JOURNAL_NAME).write_text("")
    before = len(os.listdir("/proc/self/fd"))
    lock = claim_destination(dst, overwrite=False, resume=True)
    assert len(os.listdir("/proc/self/fd")) == before + 1  # one descriptor: the lock's
    assert (dst / spec.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()
    assert len(os.listdir("/proc/self/fd")) == before
    assert not (dst / spec.LOCK_NAME).exists()
