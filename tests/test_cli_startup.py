"""``imgpack --help``, ``--version`` and ``info`` start without torch (1.5 s of imports, 0.05 s
without), and so does a conversion of JPEGs and PNGs to any format but ``pt``, its workers
too.

The command's modules load when their command runs (``convert.cli.COMMANDS``), and the public
names of ``readers`` and ``convert`` are imported on first use (PEP 562), so these tests pin
what that laziness must keep: each lazy table lists exactly what the package's
``TYPE_CHECKING`` block imports and its ``__all__`` names, and every name and command
resolves to the real object.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import convert
import readers
from convert.cli import COMMANDS, main
from readers.images import kernel
from readers.images.decode import decoder_name

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import sys
from convert.cli import main
try:
    main({args!r})
except SystemExit as e:
    assert e.code == 0, e.code
print("torch imported:", "torch" in sys.modules)
"""


def run_probe(args: list[str]) -> str:
    """What ``imgpack ARGS`` printed in a fresh process, checked to import no torch."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().endswith("torch imported: False"), run.stdout
    return run.stdout


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_do_not_import_torch(flag: str) -> None:
    expected = f"version {readers.__version__}" if flag == "--version" else "Commands:"
    assert expected in run_probe([flag])


def test_info_reads_the_manifest_without_torch(converted) -> None:
    assert "samples    32 written, 0 skipped" in run_probe(
        ["info", str(converted("pt", "raw-fixed"))]
    )


CONVERSIONS = """
import sys
from convert.cli import main


class NoTorch:  # in this process and the pool's workers (forked from it): an import fails
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise ImportError("a conversion imported torch")


RESIZE = {"stored": [], "resized": ["--resize", "64"]}
for run in sys.argv[3:]:  # FORMAT-WORKERS-SIZE
    fmt, workers, size = run.split("-")
    if fmt == "pt":
        sys.meta_path = [f for f in sys.meta_path if not isinstance(f, NoTorch)]
    elif not any(isinstance(f, NoTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, NoTorch())
    dst = f"{sys.argv[2]}/{run}"
    try:
        main(["convert", sys.argv[1], dst, "--format", fmt, "--workers", workers, *RESIZE[size]])
    except SystemExit as e:
        assert e.code == 0, e.code
    print(run, "torch imported:", "torch" in sys.modules)
"""


@pytest.mark.skipif(
    kernel.crop_kernel() is None or decoder_name() != "turbojpeg",
    reason="without the compiled kernel and PyTurboJPEG, torch resizes the images",
)
def test_a_conversion_imports_torch_only_to_write_pt(tmp_path: Path) -> None:
    """The kernel resizes JPEGs and the sample folder's PNGs, the other formats' writers and
    the shard checks need no torch: the main process starts a second sooner, and so do the
    pool's workers (forked before any torch import) and an in-process run (``--workers 1``).
    One process converts the stored and the resized images in every format, ``pt`` last: a
    torch import anywhere before the ``pt`` runs fails it."""
    others = [
        f"{fmt}-{size}"
        for size in ("stored", "resized")
        for fmt in ("lmdb-1", "lmdb-2", "hdf5-2", "wds-2")
    ]
    runs = [*others, "pt-2-stored", "pt-2-resized"]
    run = subprocess.run(
        [sys.executable, "-c", CONVERSIONS, str(ROOT / "sample_data"), str(tmp_path), *runs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    imported = [line.split()[-1] for line in run.stdout.splitlines() if "torch imported" in line]
    assert imported == ["False"] * len(others) + ["True", "True"], run.stdout
    for name in runs:
        assert len(readers.open_dataset(tmp_path / name)) == 32


def test_help_lists_every_command_and_each_loads_when_it_runs() -> None:
    listed = CliRunner().invoke(main, ["--help"]).output
    for name, (module, short_help) in COMMANDS.items():
        assert f"  {name} " in listed and short_help in listed
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command) and command.name == name
        shown = CliRunner().invoke(main, [name, "--help"])
        assert shown.exit_code == 0 and f"Usage: main {name}" in shown.output
    unknown = CliRunner().invoke(main, ["nosuch"])
    assert unknown.exit_code == 2 and "No such command 'nosuch'" in unknown.output


def type_checking_imports(package: str) -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` block of ``package``'s ``__init__``."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    return {
        alias.name: node.module or ""
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


@pytest.mark.parametrize("package", [readers, convert], ids=lambda p: p.__name__)
def test_lazy_names_are_the_typed_ones_and_resolve_to_their_objects(package) -> None:
    table = package._EXPORTS
    assert table == type_checking_imports(package.__name__)
    assert sorted(table) == sorted(package.__all__)
    for name, module in table.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
        package.nosuch  # noqa: B018 (the lookup is the test)


def test_readers_still_binds_its_subpackages_by_name() -> None:
    assert readers.spec is importlib.import_module("readers.spec")
    assert "open_dataset" in dir(readers)
