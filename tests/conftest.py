"""Shared fixtures: the bundled sample folder, converted datasets built from it, and a local
Ray instance with a driver process for it."""

from __future__ import annotations

import fcntl
import gc
import hashlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from convert import ConvertOptions, convert_folder
from readers import compiled, spec
from readers.images.kernel import crop_kernel
from scripts.s3_server import S3Server
from tests.ray_nodes import RayDriver, ray_cluster

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = ROOT / "sample_data"

# The geometry each encoding is tested with: fixed-size raw, variable raw, resized JPEG,
# untouched originals. They resize exactly, as torchvision does, so that their pixels can be
# compared with torchvision's; tests/test_decode.py covers the default DCT-scaled decode.
ENCODING_CASES = {
    "raw-fixed": {"encoding": "raw", "resize": 72, "center_crop": 64, "exact_resize": True},
    "raw-variable": {"encoding": "raw", "resize": 48, "exact_resize": True},
    "jpeg": {"encoding": "jpeg", "resize": 80, "exact_resize": True},
    "original": {"encoding": "original"},
}


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``converted(fmt, case, **extra)`` -> a dataset of sample_data, built once per run:
    tests only read these, so under pytest-xdist the workers share them (the first worker
    to ask converts, under a lock, in the run's own temporary folder)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's basetemp
    cache: dict[tuple, Path] = {}

    def build(fmt: str, case: str, **extra) -> Path:
        key = (fmt, case, tuple(sorted(extra.items())))
        if key not in cache:
            name = f"converted-{fmt}-{case}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"
            dst = shared / name
            with open(shared / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
                if not (dst / spec.MANIFEST_NAME).exists():
                    options = ConvertOptions(format=fmt, **ENCODING_CASES[case], **extra)
                    # in this process: the pool is tested where it is the subject
                    convert_folder(
                        SAMPLE_DATA, dst, options, workers=1, overwrite=True, progress=False
                    )
            cache[key] = dst
        return cache[key]

    return build


@pytest.fixture
def python_path() -> Iterator[None]:
    """This process (and the workers it forks) without the compiled modules, as
    ``IMGPACK_KERNEL=0`` at its start makes it: the crop kernel and the CRC and Feistel
    modules are looked up again, as the test leaves too."""
    before = os.environ.get(compiled.COMPILED_ENV)
    os.environ[compiled.COMPILED_ENV] = "0"
    crop_kernel.cache_clear()
    compiled.compiled_module.cache_clear()
    try:
        yield
    finally:
        if before is None:
            del os.environ[compiled.COMPILED_ENV]
        else:
            os.environ[compiled.COMPILED_ENV] = before
        crop_kernel.cache_clear()
        compiled.compiled_module.cache_clear()


@pytest.fixture(scope="module")
def ray_address(s3_server: S3Server) -> Iterator[str]:
    """A local Ray instance for the module (a head node of 2 CPUs), started after the
    module's ``s3_server`` so that its workers have that endpoint; its address."""
    pytest.importorskip("ray")
    with ray_cluster(dict(os.environ), head_cpus=2) as address:
        yield address


@pytest.fixture(scope="module")
def ray_driver(ray_address: str) -> Iterator[RayDriver]:
    """Runs the module's conversions on Ray, each in a driver process of its own."""
    driver = RayDriver(ray_address)
    yield driver
    driver.close()


# The quick tier (`make check`) leaves out what starts servers or clusters, besides the tests
# marked torchrun, fuzz, wheel, slow or soak: a test that takes one of these fixtures is
# marked by it, so a new one lands in the right tier without a decorator.
_TIER_FIXTURES = {"s3_server": "server", "ray_address": "cluster", "ray_driver": "cluster"}
# Under pytest-xdist (`--dist loadgroup`) a module's tests that share a server, a Ray
# instance or process-group runs (module-scoped fixtures) stay on one worker, so that these
# start once, not once per worker.
_ONE_WORKER = ("server", "cluster", "torchrun")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in _TIER_FIXTURES:
                item.add_marker(_TIER_FIXTURES[fixture])
        if any(item.get_closest_marker(name) for name in _ONE_WORKER):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every object alive once the tests are collected (torch, the imported modules, the
    test functions) lives to the end: frozen out of the garbage collector's full passes.
    Those passes in the two test processes took 3.1 s of a quick-tier run, 1.1 s frozen, and
    the DataLoader and conversion workers forked from them no longer walk those objects."""
    gc.collect()
    gc.freeze()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Scale of tests/test_soak.py: CI's default is short; raise both for a long run."""
    group = parser.getgroup("soak", "soak test (tests/test_soak.py)")
    group.addoption(
        "--soak-samples", type=int, default=3000, help="samples in the soak dataset (3000)"
    )
    group.addoption("--soak-epochs", type=int, default=3, help="epochs per soak case (3)")


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT as a terminal leaves it; under pytest-xdist (one test process per core),
    torch's intra-op threads: one per process, and in the processes the tests start. A team
    per process oversubscribed the cores: each OpenMP barrier waited on a thread the other
    processes had descheduled, and a small resize took 10-30 times as long."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a script (`make test &`): SIGINT is ignored, and the
        # conversions the tests interrupt would inherit that and never see their Ctrl-C.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # `make asan`: GCC 12's AddressSanitizer takes no lock of its allocator around fork(),
        # so a process forked while a decode thread frees memory can inherit that lock held
        # and hang at its first allocation (a clean-clone CI run: a DataLoader worker, at its
        # first thread's start). Workers and pools then start from a forkserver: an exec'd,
        # single-threaded process whose children cannot inherit it. Plain builds fork (glibc's
        # malloc locks its arenas around fork()).
        multiprocessing.set_start_method("forkserver", force=True)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch  # here, not at the top: xdist's controller runs no test, needs no torch

        torch.set_num_threads(1)
