"""Measuring: ``ds.stored``, ``imgpack bench``, ``imgpack tune`` / ``readers.tune_loader``,
the stall meter and the device prefetcher's CPU path, on sample_data (small and fast: these
check structure and sanity, not speed)."""

from __future__ import annotations

import ast
import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import readers
from convert.cli import main
from convert.cli.measure import verdict
from convert.measure import report
from convert.measure.bench import FolderDataset, crop_for, open_source, resident_fraction
from convert.measure.report import TABLE_WIDTH, Row, columns, format_table
from convert.scan import scan_folder
from readers import spec
from readers.feeding import tune
from readers.feeding.wait import WAIT_SHARE, WaitReport, keeps_up

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def run(*args: object):
    """``imgpack ARGS`` in this process. The bench collects garbage before each measurement
    (a reopened dataset must not share pages with the last one): this test process's own heap
    (every collected test, 0.1-0.3 s a collection) is kept out of those collections, frozen,
    as the command's own process has none of it."""
    gc.freeze()
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("fmt", spec.FORMATS)
@pytest.mark.parametrize("case", ["raw-fixed", "jpeg"])
def test_stored_gives_the_undecoded_sample(converted, fmt, case):
    ds = readers.open_dataset(converted(fmt, case))
    for i in (0, 17, 31):
        value = ds.stored(i)
        image, _ = ds[i]
        if case == "raw-fixed":
            assert isinstance(value, np.ndarray) and value.dtype == np.uint8
            assert torch.equal(
                torch.from_numpy(np.ascontiguousarray(value)).permute(2, 0, 1), image
            )
        else:
            assert not isinstance(value, np.ndarray)
            assert torch.equal(
                torch.from_numpy(readers.decode_image(value)).permute(2, 0, 1), image
            )


def test_bench_measures_datasets_and_a_plain_folder(converted, sample_data, tmp_path):
    wds = tmp_path / "imagenet-1k-train-wds-raw-shuffled-seed-1"  # a long name, as users give
    wds.symlink_to(converted("wds", "raw-fixed", shard_size=4, shuffle=True, seed=1))
    pt = converted("pt", "jpeg")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run(
        "bench", pt, wds, sample_data, "--samples", 100, "--repeats", 2, "--workers", "0,1",
        "--batch-size", 8, "--seconds", 0.05, "--json", out, "--plot", png,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= TABLE_WIDTH, result.output  # 196 columns before
    assert lines[0].split() == ["raw", "read", "µs", "decoded", "µs", "batch", "sequential",
                                "DataLoader", "samples/s"]  # fmt: skip
    assert lines[1].split() == ["path", "p50", "p90", "p99", "p99.9", "p50", "p99", "ms", "/s",
                                "MB/s", "w=0", "w=1"]  # fmt: skip
    table = lines[2 : lines.index("cache: warm (an untimed pass first)")]
    printed = [line.split("  ")[0] for line in table]
    assert printed[3] == "sample_data (folder)" and printed[2].endswith(" (wds) stream")
    assert table[2].split()[-3:-2] == ["stream"]  # a stream row: its two rates only
    document = json.loads(out.read_text())
    drawn = report.plot(document["results"], (0, 1), tmp_path / "again.png")
    assert len(drawn) == len(printed) == 4  # the plot's bars: one series per row of the table
    for label, shown in zip(drawn, printed, strict=True):  # the table may shorten a name
        assert re.fullmatch(".+".join(map(re.escape, shown.split("…"))), label), (label, shown)
    assert document["machine"]["cpus"] >= 1 and "torch" in document["machine"]
    assert set(document["machine"]["storage"]) == {str(pt), str(wds), str(sample_data)}
    kinds = [r["kind"] for r in document["results"]]
    assert kinds == ["pt", "wds", "folder"]
    for r in document["results"]:
        assert r["samples"] == 32 and r["bytes"] > 0
        figures = r["figures"]
        for name in ("stored", "decoded"):
            p = [figures[f"{name}_p{q}_us"]["median"] for q in ("50", "90", "99", "99.9")]
            assert 0 < p[0] <= p[1] <= p[2] <= p[3], (r["kind"], name, p)
            assert len(r["latency_us"][name]) == 2 * 100
        for key in ("batch_ms", "sequential_samples_per_s", "sequential_mb_per_s",
                    "loader_w0_samples_per_s", "loader_w1_samples_per_s"):  # fmt: skip
            assert figures[key]["median"] > 0 and len(figures[key]["runs"]) == 2
        assert ("stream_w1_samples_per_s" in figures) == (r["kind"] == "wds")
    with Image.open(png) as image:
        assert image.size[0] > 800


def test_the_bench_table_fits_its_width_with_many_workers_and_long_names():
    workers = (0, 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    cols = columns(workers)
    big = {c.key: 1_234_567.0 + k for k, c in enumerate(cols)}  # every cell 9 characters
    name = "imagenet-1k-train-" + "x" * 60 + "-jpeg-256"
    streamed = {c.key: 2_000.0 for c in cols if c.key.startswith("loader")}
    rows = [Row(f"{name} (wds)", big, 0), Row(f"{name} (wds) stream", streamed, 0, True)]
    text = format_table(cols, rows)
    lines = text.splitlines()
    assert max(map(len, lines)) <= TABLE_WIDTH
    for k, c in enumerate(cols):  # each figure once, under its own heading, in some block
        assert text.count(f"{1_234_567 + k:,}") == 1, c.key
    assert text.count("imagenet-1k-t") == 2 * (text.count("\n\n") + 1)  # each block: both
    for label in (line.split("  ")[0] for line in lines if "(wds)" in line):
        assert label.startswith("imagenet-1k-t") and "…" in label  # cut in the middle
        assert label.endswith(("-jpeg-256 (wds)", "-jpeg-256 (wds) stream")), label
    few = format_table(columns((0, 2)), [Row("in1k (pt)", {"batch_ms": 3.0}, 0)])
    assert "\n\n" not in few and few.splitlines()[2].split() == ["in1k", "(pt)", "3.00"]


def test_bench_cold_drops_the_datasets_pages_and_says_so(converted, tmp_path):
    root = converted("lmdb", "raw-fixed")
    files = [p for p in root.iterdir() if p.name.startswith(spec.SHARD_PREFIX)]
    result = run("bench", root, "--samples", 50, "--repeats", 1, "--workers", "0", "--cold")
    assert result.exit_code == 0, result.output
    assert "cache: cold" in result.output
    assert "% still cached" in result.output or "cannot" in result.output
    assert resident_fraction(files) is not None


def test_bench_plot_without_matplotlib_says_how_to_install_it(converted, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    root = converted("pt", "raw-fixed")
    result = run("bench", root, "--samples", 20, "--repeats", 1, "--workers", "0",
                 "--plot", tmp_path / "x.png")  # fmt: skip
    assert result.exit_code == 1
    # Said first, in one line, before any measuring.
    assert result.output == (
        "Error: --plot needs matplotlib: pip install -e '.[plot]' in the imgpack checkout "
        "(or pip install matplotlib)\n"
    )


def test_bench_refuses_a_folder_without_images(tmp_path):
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    result = run("bench", tmp_path / "empty", "--repeats", 1)
    assert result.exit_code == 1 and "no images" in result.output


def test_bench_says_what_the_library_warned_about_as_a_one_line_note(converted):
    wds = converted("wds", "raw-fixed", shard_size=4)  # without --shuffle: the stream warns
    imgpack = Path(sys.executable).parent / "imgpack"
    argv = [imgpack, "bench", wds, "--samples", 20, "--repeats", 1, "--workers", "0",
            "--seconds", 0.05]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no "UserWarning" and its source line
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "converted without --shuffle" in notes[0], proc.stdout


def test_bench_loaders_crop_with_the_readers_crop(converted, sample_data):
    crop = readers.CenterCrop(240)  # larger than some photos: zero-padded, so batches stack
    original = converted("pt", "original")
    for source in (open_source(original), open_source(sample_data)):
        images = next(iter(source.loader(0, 8, crop)))[0]
        assert isinstance(images, torch.Tensor), source.kind
        assert images.shape == (8, 3, 240, 240) and images.dtype == torch.uint8
    scan = scan_folder(sample_data)  # the folder: decoded whole, then the same box
    folder = FolderDataset(
        sample_data, [s.relpath for s in scan.samples], [s.label for s in scan.samples], crop
    )
    fused = readers.open_dataset(original, crop=crop)
    for i in range(len(fused)):
        assert torch.equal(folder[i][0], fused[i][0]), scan.samples[i].relpath


def test_a_crop_the_size_of_the_stored_images_is_not_applied(converted, tmp_path):
    assert crop_for((64, 64, 3), 64) is None and crop_for((64, 64, 3), None) is None
    assert crop_for((64, 64, 3), 32).size == (32, 32) and crop_for(None, 64).size == (64, 64)
    root = converted("pt", "raw-fixed")  # 64 x 64 pixels
    out = tmp_path / "bench.json"
    result = run("bench", root, "--samples", 20, "--repeats", 1, "--workers", "0",
                 "--seconds", 0.05, "--crop", 64, "--json", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"note: {root}: stored at 64x64 already, so read without crop=" in result.output
    assert json.loads(out.read_text())["results"][0]["crop"] is None
    # a step the first setting keeps up with: the sweep stops there, before any worker
    result = run("tune", root, "--batch-size", 8, "--seconds", 0.05, "--crop", 64, "--step-ms", 100)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"{root} stores 64x64 images already: measured without crop="
    assert "crop" not in parse_call(lines[-1])[2]


def parse_call(line: str) -> tuple[ast.expr, list[object], dict[str, str | object]]:
    """The function, positional values and keywords of the ``make_loader`` call printed;
    a keyword that is itself a call (``crop=readers.CenterCrop(48)``) as its source."""
    call = ast.parse(line).body[0].value  # type: ignore[attr-defined]
    keywords = {
        k.arg: ast.unparse(k.value) if isinstance(k.value, ast.Call) else ast.literal_eval(k.value)
        for k in call.keywords
    }
    return call.func, [ast.literal_eval(a) for a in call.args], keywords


def test_tune_prints_each_setting_and_a_recommendation_from_them(converted):
    root = converted("lmdb", "jpeg", center_crop=64)
    result = run("tune", root, "--batch-size", 8, "--seconds", 0.1)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("num_workers=")]
    assert len(rows) == len(tune.candidate_settings())  # no step: the whole sweep
    assert result.output.splitlines()[-2] == "recommended:"
    func, args, kwargs = parse_call(result.output.splitlines()[-1])
    assert ast.unparse(func) == "readers.make_loader" and args == [str(root)]
    assert kwargs.pop("batch_size") == 8 and "crop" not in kwargs
    assert kwargs in [s.kwargs() for s in tune.candidate_settings()]


def test_tune_refuses_what_is_not_a_dataset_in_one_line_before_any_table(tmp_path):
    (tmp_path / "file.jpg").write_bytes(b"not a dataset")
    for path in (tmp_path, tmp_path / "file.jpg"):
        result = run("tune", path, "--step-ms", 40, "--crop", 128)
        assert result.exit_code == 1
        assert result.output.splitlines() == [result.output.strip()], result.output
        assert (
            result.output.startswith(f"Error: {path}: not a") and "Traceback" not in result.output
        )


def test_keeps_up_is_the_measured_wait_not_the_rate():
    assert WAIT_SHARE == 0.05
    assert not keeps_up(10.4, 40)  # the run: 3.8x, yet 26 % of every step
    assert keeps_up(2.0, 40) and keeps_up(0.0, 40)
    assert not keeps_up(2.01, 40) and not keeps_up(None, 40)
    fast_in_process = tune.Trial(tune.Setting(0, 2, None, False), 6080.0, 12.0, 10.4, 3.8)
    workers = tune.Trial(tune.Setting(2, 1, 2, False), 3200.0, 110.0, 0.4, 2.0)
    assert tune.recommend([fast_in_process, workers], step_ms=40) is workers
    said = verdict(workers, 40, "jpeg")
    assert said.startswith("loading is not the bottleneck: with num_workers=2")
    assert tune.recommend([fast_in_process], step_ms=40) is fast_in_process
    said = verdict(fast_in_process, 40, "jpeg")
    assert said.startswith("loading IS the bottleneck") and "10.4 ms per 40 ms step (26 %)" in said
    assert "not overlap" in said  # why a loader 3.8x as fast still stalls: no workers
    assert "(raw)" in said and "(raw)" not in verdict(fast_in_process, 40, "raw")


def test_tune_does_not_clear_a_fast_loader_that_leaves_the_loop_waiting(converted):
    root = converted("lmdb", "raw-fixed")

    def slow(image: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)  # 20 ms per batch of 4, on the loop's own thread (no workers)
        return image

    in_process = tune.Setting(0, 1, None, False)
    (trial,) = tune.sweep(root, 4, step_ms=200, seconds=0.05, settings=[in_process], transform=slow)
    assert trial.ratio >= 1.5  # ~9x: the old rate rule (1.5x) called this "not the bottleneck"
    assert trial.wait_ms >= 20  # the whole load, in every step: 10 % of it at least
    assert not keeps_up(trial.wait_ms, 200)
    assert tune.recommend([trial], 200) is trial
    assert verdict(trial, 200, "raw").startswith("loading IS the bottleneck")


def test_tune_with_a_step_time_stops_at_the_first_setting_that_keeps_up(converted):
    root = converted("pt", "jpeg")
    result = run("tune", root, "--batch-size", 4, "--seconds", 0.05, "--step-ms", 100,
                 "--crop", 48)  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert " ".join(lines[0].split()).endswith("wait ms/batch wait % of step loader/compute")
    rows = [line.rsplit(None, 5) for line in lines if line.startswith("num_workers=")]
    shares = [float(row[-2]) for row in rows]
    assert all(row[-1].endswith("x") for row in rows)
    (said,) = [line for line in lines if line.startswith("loading ")]
    if said.startswith("loading is not the bottleneck"):  # the last measured kept up
        assert shares[-1] <= 5.05 and all(share >= 4.95 for share in shares[:-1])
        assert said.split("with ", 1)[1].startswith(rows[-1][0].strip())
    else:  # nothing kept up: the whole sweep
        assert said.startswith("loading IS the bottleneck") and "Consider" in said
        assert len(rows) == len(tune.candidate_settings()) and min(shares) >= 4.95
    func, args, kwargs = parse_call(lines[-1])
    assert ast.unparse(func) == "readers.make_loader" and args == [str(root)]
    assert kwargs.pop("batch_size") == 4
    assert kwargs.pop("crop") == "readers.CenterCrop(48)"  # what the sweep measured with
    assert kwargs in [t.kwargs() for t in tune.candidate_settings()]


def test_the_wait_is_timed_once_the_queue_has_refilled():
    def drained_then_ready():  # a worker pool whose queue the rate run just emptied
        time.sleep(0.1)
        while True:
            yield torch.zeros(4, 3), torch.zeros(4)

    samples, _, wait_s = tune._timed(drained_then_ready(), 0.0, 0.01)
    assert samples == 5 * 4
    assert wait_s < 0.01  # timed, the first batch alone made it 20 ms (100 ms / 5)


def test_tune_recommends_the_least_wait_when_nothing_keeps_up():
    fast = tune.Trial(tune.Setting(2, 1, 2, False), 900.0, 50.0, 5.0, 1.2)
    cheap = tune.Trial(tune.Setting(0, 1, None, False), 400.0, 5.0, 30.0, 0.5)
    same = tune.Trial(tune.Setting(1, 1, 2, False), 880.0, 40.0, 6.0, 1.17)
    assert tune.recommend([cheap, same, fast], step_ms=40) is same  # within 2 ms, cheaper
    assert tune.recommend([cheap, fast], step_ms=40) is fast
    less_wait = tune.Trial(tune.Setting(2, 1, 4, False), 700.0, 60.0, 3.0, 0.95)
    assert tune.recommend([cheap, fast, less_wait], step_ms=20) is less_wait  # not the rate
    assert tune.recommend([cheap, same, fast]) is same  # no step: the rate, within 5 %


def test_measure_wait_reports_an_injected_delay():
    made: list[float] = []  # what each batch really took to make: a loaded machine oversleeps

    def slow_batches(n: int, delay: float, first: float | None = None):
        for k in range(n):
            started = time.perf_counter()
            time.sleep(first if k == 0 and first is not None else delay)
            batch = torch.zeros(2, 3), torch.tensor([k, k])
            made.append(time.perf_counter() - started)
            yield batch

    meter = readers.measure_wait(slow_batches(21, 0.02, first=0.1))  # a slow start-up
    arrived = None
    for _ in meter:
        arrived = arrived or time.perf_counter()
        time.sleep(0.005)  # the model's step
    seconds = time.perf_counter() - arrived
    report = meter.report()
    assert report["batches"] == 21
    # The first batch on its own; the rest against this test's own clock, not the nominal
    # 20 of every 25 ms. A wait holds the making of its batch, and a few microseconds more
    # (more if the machine preempts the loop there).
    assert 1000 * made[0] <= report["first_batch_ms"] < 1000 * made[0] + 10
    steady = made[1:]
    assert report["wait_fraction"] == pytest.approx(sum(steady) / seconds, abs=0.03)
    assert report["wait_fraction"] > 0.5  # the start-up's 100 ms would add about 0.2
    median = 1000 * float(np.median(steady))
    assert median <= report["wait_ms_p50"] < median + 5
    assert report["wait_ms_p99"] >= report["wait_ms_p50"]
    assert report["batches_per_s"] == pytest.approx(20 / seconds, rel=0.05)
    assert "the data pipeline is the bottleneck" in str(report)
    quick = readers.measure_wait(slow_batches(11, 0.0))
    for _ in quick:
        time.sleep(0.02)
    waited = quick.report()["wait_fraction"]
    assert waited < 0.1  # batches ready at once: what is left is the machine's scheduling
    verdict_said = "keeps up" if keeps_up(waited, 1 - waited) else "is the bottleneck"
    assert verdict_said in str(quick.report())  # the rule itself: with given numbers, below


def test_the_stall_meter_judges_by_the_same_rule_as_tune():
    figures = {"batches": 100, "seconds": 10.0, "batches_per_s": 10.0, "wait_ms_p50": 1.0,
               "wait_ms_p99": 9.0, "first_batch_ms": 200.0}  # fmt: skip
    seven = WaitReport(figures, wait_fraction=0.07)  # 7.5 % of the compute time
    assert "the data pipeline is the bottleneck" in str(seven)
    assert "keeps up" in str(WaitReport(figures, wait_fraction=0.04))  # 4.2 %
    assert keeps_up(0.04, 0.96) and not keeps_up(0.07, 0.93)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """``torch.testing.assert_close``'s check of float32 tensors, without the sympy import
    its first call makes (0.5 s and 30 MB a test process, which every later fork copies)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    assert torch.allclose(got, want, rtol=1.3e-6, atol=1e-5), (got - want).abs().max()


def test_device_prefetcher_on_the_cpu_equals_the_plain_conversion(converted):
    loader = readers.make_loader(converted("hdf5", "raw-fixed"), 8, seed=3)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    plain = [(x.float().div(255), y) for x, y in loader]
    loader.set_epoch(0)
    fed = list(readers.DevicePrefetcher(loader, "cpu", mean=mean, std=std, channels_last=True))
    assert len(fed) == len(plain) == 4
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    for (x, y), (want, labels) in zip(fed, plain, strict=True):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        assert_close(x, (want - m) / s)
        assert torch.equal(y, labels)
    loader.set_epoch(0)
    unnormalised = next(iter(readers.DevicePrefetcher(loader, "cpu")))[0]
    assert unnormalised.is_contiguous() and torch.equal(unnormalised, plain[0][0])
    with pytest.raises(ValueError, match="both"):
        readers.DevicePrefetcher(loader, mean=mean)


def test_a_state_taken_inside_the_prefetcher_resumes_at_the_next_batch(converted):
    # The prefetcher takes a batch from the loader only when the loop asks for it, so the
    # loader's state counts the batches the loop has, not one more (on CUDA too: one loop)
    root = converted("hdf5", "raw-fixed")
    whole = [y for _, y in readers.make_loader(root, 4, seed=5)]
    loader = readers.make_loader(root, 4, seed=5)
    fed = iter(readers.DevicePrefetcher(loader, "cpu"))
    trained = [next(fed)[1] for _ in range(3)]
    resumed = readers.make_loader(root, 4, seed=5)
    resumed.load_state_dict(loader.state_dict())
    assert torch.equal(torch.cat(trained + [y for _, y in resumed]), torch.cat(whole))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_undecoded_samples_decode_in_the_prefetcher_like_the_readers(converted, fmt, caplog):
    root = converted(fmt, "jpeg")
    plain = readers.open_dataset(root)
    raw = readers.open_dataset(root, decode=False)
    for i in (0, 9):
        value = raw[i][0]
        assert value.dtype == torch.uint8 and value.ndim == 1
        assert value.numpy().tobytes() == bytes(plain.stored(i))
    loader = readers.make_loader(root, 4, decode=False, shuffle=False)
    with caplog.at_level("WARNING", logger="readers.feeding.device"):
        fed = list(readers.DevicePrefetcher(loader, "cpu", gpu_decode=True))
    assert sum("decoding on the CPU" in r.getMessage() for r in caplog.records) <= 1
    images = [image for batch, _ in fed for image in batch]  # sizes vary: lists
    assert len(images) == len(plain) == 32
    for i, image in enumerate(images):
        assert_close(image, plain[i][0].float().div(255))
    with pytest.raises(ValueError, match="transform= and crop= need decoded images"):
        readers.open_dataset(root, decode=False, transform=lambda x: x)
