"""The layout's rules that the tree alone does not enforce (CONTRIBUTING, "Where things live").

- Every module of the library and the scripts, and every C unit and header, stays under 400
  lines: past that a module holds more than one concern and wants a room of its own.
- The C units' ``#include "..."`` graph has no circle (scratch and taps on the ground floor).
- ``readers/formats/`` knows shards, not datasets: nothing there imports ``torch.utils.data``.
- Where this process stands (rank, world size, DataLoader worker) is looked up in one module,
  ``readers/placement.py``; everything else receives a ``Placement`` or asks it.
- The usable CPUs are counted in one module, ``readers/cpus.py``.
- ``make_loader``'s body (its docstring aside) stays under 60 lines.
- ``readers/epochs/`` builds on the modules directly in ``readers/``; those it imports import
  nothing from ``readers/epochs/`` (a fact about the process, like its placement, lives below).

The files are parsed, never imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400
PLACEMENT = Path("readers/placement.py")
CPUS = Path("readers/cpus.py")  # the one count of usable CPUs
# What tells a process where it stands: torch.distributed's placement calls, the launcher's
# variables, the DataLoader's worker info.
PLACEMENT_CALLS = {"get_rank", "get_world_size", "get_worker_info"}
PLACEMENT_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}


def modules(*folders: str) -> list[Path]:
    return sorted(p.relative_to(ROOT) for f in folders for p in (ROOT / f).rglob("*.py"))


@pytest.mark.parametrize("path", modules("convert", "readers", "scripts"), ids=str)
def test_every_module_stays_under_400_lines(path: Path) -> None:
    lines = len((ROOT / path).read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"{path} has {lines} lines: split it by concern"


def c_files(*folders: str) -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for f in folders
        for ext in ("*.c", "*.h")
        for p in (ROOT / f).rglob(ext)
    )


@pytest.mark.parametrize("path", c_files("readers"), ids=str)
def test_every_c_unit_and_header_stays_under_400_lines(path: Path) -> None:
    lines = len((ROOT / path).read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"{path} has {lines} lines: split it by concern"


def include_graph(folder: Path) -> dict[str, set[str]]:
    """Unit (a ``.c`` with its ``.h``, by stem) -> the units its files ``#include "..."``."""
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.[ch]")):
        text = path.read_text(encoding="utf-8")
        included = {Path(m).stem for m in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M)}
        graph.setdefault(path.stem, set()).update(included - {path.stem})
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` as the units along it, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str]:
        state[unit] = 1
        path.append(unit)
        for other in sorted(graph.get(unit, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[unit] = 2
        return []

    for unit in sorted(graph):
        if unit not in state and (found := visit(unit)):
            return found
    return []


def test_circle_finds_a_circle() -> None:
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("folder", ["readers/images", "readers/formats"])
def test_the_c_units_include_no_circle(folder: str) -> None:
    graph = include_graph(ROOT / folder)
    found = circle(graph)
    assert not found, f"{folder}: the units include each other: {' -> '.join(found)}"


def test_the_kernels_ground_floor_includes_no_other_unit() -> None:
    """Scratch buffers and resize taps are the ground floor: they include only the shared
    types, so every unit above can use them and none of them calls back up."""
    graph = include_graph(ROOT / "readers/images")
    assert graph["scratch"] <= {"kernel_types"} and graph["taps"] <= {"kernel_types"}, graph


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", modules("readers/formats"), ids=str)
def test_shard_readers_import_nothing_from_torch_utils_data(path: Path) -> None:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    taken = {m for m in imported_modules(tree) if m.startswith("torch.utils.data")}
    assert not taken, f"{path} imports {taken}: datasets belong in readers/dataset.py"


def module_name(path: Path) -> str:
    return ".".join(path.with_suffix("").parts).removesuffix(".__init__")


def top_level_imports(path: Path) -> set[str]:
    """What ``path`` imports at module level (not the lazy imports inside its functions)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return imported_modules(
        ast.Module([n for n in tree.body if not isinstance(n, ast.FunctionDef)], [])
    )


def test_the_floor_under_readers_epochs_imports_nothing_from_it() -> None:
    """The modules directly in ``readers/`` that ``readers/epochs/`` imports at module level are
    its floor; ``make_loader``'s lazy hand-over to the mixture and bucket loaders (which build
    on ``readers/epochs/``) is not."""
    epochs = modules("readers/epochs")
    floor = {
        path
        for path in modules("readers")
        if path.parent == Path("readers") and path.name != "__init__.py"
    }
    used = {
        path
        for module in epochs
        for path in floor
        if module_name(path) in top_level_imports(module)
    }
    upward = {
        f"{path} imports {name}"
        for path in used
        for name in imported_modules(ast.parse((ROOT / path).read_text(encoding="utf-8")))
        if name.startswith("readers.epochs")
    }
    assert used and not upward, f"arrows up into readers/epochs/: {sorted(upward)}"


def placement_lookups(tree: ast.AST) -> list[tuple[int, str]]:
    """Lines of ``tree`` that look up the process's placement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name):
            name = node.attr if isinstance(node, ast.Attribute) else node.id
            if name in PLACEMENT_CALLS:
                found.append((node.lineno, name))
        elif isinstance(node, ast.Constant) and node.value in PLACEMENT_VARIABLES:
            found.append((node.lineno, repr(node.value)))
    return found


def test_placement_is_looked_up_in_one_module_only() -> None:
    elsewhere = [
        f"{path}:{line} {name}"
        for path in modules("readers", "convert")
        if path != PLACEMENT
        for line, name in placement_lookups(ast.parse((ROOT / path).read_text(encoding="utf-8")))
    ]
    assert not elsewhere, "placement looked up outside readers/placement.py:\n" + "\n".join(
        elsewhere
    )
    assert placement_lookups(ast.parse((ROOT / PLACEMENT).read_text(encoding="utf-8")))


@pytest.mark.parametrize("package", ["convert", "readers"])
def test_every_folder_of_the_library_is_a_package(package: str) -> None:
    """``packages = find:`` installs folders with an ``__init__.py`` only: a room without one
    works from the checkout and is missing from a wheel."""
    folders = {p.parent for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"folders without __init__.py: {missing}"


def test_usable_cpus_are_counted_in_one_module_only() -> None:
    """``readers/cpus.py`` counts the CPUs this process may use; a second count elsewhere
    drifts (``os.cpu_count()`` ignores taskset and cgroup affinity)."""
    counts = ("sched_getaffinity", "cpu_count")
    elsewhere = [
        f"{path}:{node.lineno} {node.attr}"
        for path in modules("readers", "convert")
        if path != CPUS
        for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in counts
    ]
    assert not elsewhere, "CPUs counted outside readers/cpus.py:\n" + "\n".join(elsewhere)


def body_lines(path: Path, name: str) -> int:
    """Lines of function ``name``'s body in ``path``, its docstring not counted."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    (function,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    assert function.end_lineno is not None
    return function.end_lineno - body[0].lineno + 1


def test_make_loader_reads_in_one_screen() -> None:
    """``make_loader`` hands each case to a named helper (argument checks, the stream's and
    the map-style source, :func:`readers.epochs.loading.build_loader`): under 60 lines."""
    lines = body_lines(Path("readers/epochs/loader.py"), "make_loader")
    assert lines < 60, f"make_loader's body is {lines} lines: give a case a helper of its own"
    assert body_lines(Path("tests/test_layout.py"), "body_lines") == 7  # the measure itself


# A timing or a speed-up measured on one machine: it goes stale in a comment and belongs in
# docs/BENCHMARKS.md, with its machine, commit and command.
MACHINE_SPEED = re.compile(r"\d\s?(µs|us|GB/s|MB/s)\b|\d+(\.\d+)?x (faster|slower)")


@pytest.mark.parametrize("path", [*modules("convert", "readers"), *c_files("readers")], ids=str)
def test_code_comments_state_no_machines_speed(path: Path) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    found = [line.strip() for line in text.splitlines() if MACHINE_SPEED.search(line)]
    assert not found, f"{path}: a machine's speed in the code (docs/BENCHMARKS.md): {found}"
