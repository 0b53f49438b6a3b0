"""The import graph of ``convert/``, ``readers/`` and ``scripts/``: no circles, and no private
name taken from another module of the library.

The modules are parsed with ``ast``, never imported, so optional packages (Ray, ffcv) need not be
installed for the walk to see their import lines. What counts as an import of a repo module:

- every ``import`` and ``from ... import`` statement anywhere in a file: at module level, in a
  ``try``, and **inside functions**. A lazy import still makes the two modules need each other
  (the importer fails at call time without the other), so a circle through one is a circle:
  ``convert/planned.py`` once imported ``convert.ray_executor`` in a function only to test
  whether Ray is installed (``importlib.util.find_spec`` answers that without importing), and
  ``scripts/bench_read.py`` imported ``bench_crops`` in ``main`` while ``bench_crops`` imported it.
  Imports under ``if TYPE_CHECKING:`` count as well (there are none): a circle of types is still
  two modules that cannot be understood apart. Code held in strings (``python -c``) is not read,
  which is one reason why ``scripts/`` holds none (``test_scripts_...`` below).
- ``from P import n`` depends on the module ``P.n`` when there is one, otherwise on ``P`` itself
  (its ``__init__`` for a package). ``import P.Q`` depends on ``P.Q``.
- A package's ``__init__`` runs before any of its modules, so it is an edge from a module outside
  that package, but not from one of its own modules (the package is already importing by then).
- ``scripts/bench/`` is a package run from the repository root (``python -m scripts.bench.read``):
  its modules are named ``scripts.bench.*`` and import from the root only. A file directly in
  ``scripts/`` is also run as ``python scripts/x.py``, which puts its folder first on
  ``sys.path``: a top-level name in it is looked up first beside it, then at the root.

Private names: ``from readers.x import _name`` (relative forms too) and ``module._name``
attribute reach-ins through a name bound to a repo module, in ``readers/`` and ``convert/``,
where the name belongs to another module. Dunder names (``__version__``) are not private.
tests/ may use private names: the rule is for the library.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("convert", "readers", "scripts")
LIBRARY = ("convert", "readers")
SCRIPT_FOLDERS = ("scripts",)  # files in them run as ``python scripts/x.py``: folder on sys.path


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` (paths relative to the repository root)."""

    source: Path
    line: int
    target: Path


@dataclass(frozen=True)
class Reach:
    """``source`` takes the private ``name`` of ``owner`` at ``line``."""

    source: Path
    line: int
    owner: Path
    name: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line} takes {self.name} from {self.owner}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class RepoModules:
    """Resolves dotted module names to the repository's files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find(self, dotted: str, beside: Path | None = None) -> Path | None:
        """The file of module ``dotted`` (relative path), looked up in ``beside`` (a folder
        relative to the root) and then at the root; ``None`` for a module outside the repo."""
        parts = dotted.split(".")
        for base in (beside, Path()) if beside is not None else (Path(),):
            stem = self.root / base / Path(*parts)
            for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
                if candidate.is_file():
                    return candidate.relative_to(self.root)
        return None

    def name_of(self, path: Path) -> str:
        """The dotted name a file is imported by, from the root."""
        parts = path.with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def beside(self, path: Path) -> Path | None:
        """The folder searched first for a top-level import in ``path``: a script's own (a file
        directly in a script folder), none for a module of a package."""
        return path.parent if path.parent.as_posix() in SCRIPT_FOLDERS else None

    def packages_of(self, path: Path) -> set[Path]:
        """The ``__init__`` files of the packages enclosing ``path`` (itself excluded)."""
        inits = set()
        for parent in path.parents:
            init = parent / "__init__.py"
            if parent != Path() and init != path and (self.root / init).is_file():
                inits.add(init)
        return inits

    def package_chain(self, dotted: str, beside: Path | None) -> list[Path]:
        """The ``__init__`` files that importing ``dotted`` runs before the module itself."""
        parts = dotted.split(".")
        chain = []
        for i in range(1, len(parts)):
            found = self.find(".".join(parts[:i]), beside)
            if found is not None and found.name == "__init__.py":
                chain.append(found)
        return chain

    def absolute(self, path: Path, node: ast.ImportFrom) -> str:
        """The absolute module name of a (possibly relative) ``from`` import in ``path``."""
        if not node.level:
            return node.module or ""
        package = self.name_of(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        return ".".join([*package, *([node.module] if node.module else [])])


@dataclass
class ModuleImports:
    """What one file imports from the repository: edges, and the private names it takes."""

    edges: list[Edge]
    reaches: list[Reach]


def scan(modules: RepoModules, path: Path) -> ModuleImports:
    """Every repo import and private reach-in of the file ``path``, at any depth."""
    tree = ast.parse((modules.root / path).read_text(encoding="utf-8"), str(path))
    beside = modules.beside(path)
    own_packages = modules.packages_of(path)
    edges: list[Edge] = []
    reaches: list[Reach] = []
    bound: dict[str, str] = {}  # a local name -> the dotted repo module it is bound to

    def depend(dotted: str, line: int) -> Path | None:
        target = modules.find(dotted, beside)
        if target is None:
            return None
        for init in modules.package_chain(dotted, beside):
            if init not in own_packages and init != path:
                edges.append(Edge(path, line, init))
        if target != path:
            edges.append(Edge(path, line, target))
        return target

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if depend(alias.name, node.lineno) is None:
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound.setdefault(top, top)
        elif isinstance(node, ast.ImportFrom):
            package = modules.absolute(path, node)
            for alias in node.names:
                submodule = f"{package}.{alias.name}"
                if alias.name != "*" and modules.find(submodule, beside) is not None:
                    depend(submodule, node.lineno)
                    bound[alias.asname or alias.name] = submodule
                    continue
                owner = depend(package, node.lineno)
                if owner is not None and owner != path and is_private(alias.name):
                    reaches.append(Reach(path, node.lineno, owner, alias.name))

    for chain, line in attribute_chains(tree):
        dotted = bound.get(chain[0])
        if dotted is None:
            continue
        for attr in chain[1:]:
            if modules.find(f"{dotted}.{attr}", beside) is not None:
                dotted = f"{dotted}.{attr}"
                continue
            owner = modules.find(dotted, beside)
            if owner is not None and owner != path and is_private(attr):
                reaches.append(Reach(path, line, owner, attr))
            break
    return ModuleImports(edges, reaches)


def attribute_chains(tree: ast.AST) -> Iterable[tuple[list[str], int]]:
    """``(["a", "b", "c"], line)`` for every longest ``a.b.c`` chain of names and attributes."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name):
            yield [value.id, *reversed(chain)], node.lineno


class ImportGraph:
    """The repo-module import graph reachable from the files of ``folders`` under ``root``."""

    def __init__(self, root: Path, folders: Iterable[str]) -> None:
        self.modules = RepoModules(root)
        self.scanned: dict[Path, ModuleImports] = {}
        todo = [p.relative_to(root) for f in folders for p in sorted((root / f).rglob("*.py"))]
        while todo:
            path = todo.pop()
            if path in self.scanned:
                continue
            self.scanned[path] = scan(self.modules, path)
            todo += [e.target for e in self.scanned[path].edges]

    def edges(self) -> dict[Path, dict[Path, int]]:
        """``{source: {target: first line importing it}}``."""
        graph: dict[Path, dict[Path, int]] = {p: {} for p in self.scanned}
        for imports in self.scanned.values():
            for edge in imports.edges:
                graph[edge.source].setdefault(edge.target, edge.line)
        return graph

    def cycles(self) -> list[str]:
        """One circle per strongly connected group of modules, each step with its line:
        ``"a.py:3 -> b.py:9 -> a.py"``."""
        graph = self.edges()
        return [self._describe(graph, group) for group in strongly_connected(graph)]

    @staticmethod
    def _describe(graph: dict[Path, dict[Path, int]], group: set[Path]) -> str:
        start = min(group)
        came_from: dict[Path, Path] = {}
        frontier = [start]
        while frontier and start not in came_from:  # breadth-first back to ``start``
            following = []
            for node in frontier:
                for target in sorted(graph[node]):
                    if target in group and target not in came_from:
                        came_from[target] = node
                        following.append(target)
            frontier = following
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(came_from[path[-1]])
        path.reverse()
        steps = [f"{a}:{graph[a][b]}" for a, b in itertools.pairwise(path)]
        return " -> ".join([*steps, str(start)])

    def reaches(self, folders: Iterable[str]) -> list[Reach]:
        """Private names taken across modules by the files under ``folders``."""
        return [
            reach
            for path, imports in sorted(self.scanned.items())
            if path.parts[0] in tuple(folders)
            for reach in imports.reaches
        ]


def strongly_connected(graph: dict[Path, dict[Path, int]]) -> list[set[Path]]:
    """The groups of two or more modules that import each other, directly or not (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    groups: list[set[Path]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def script_smells(root: Path, path: Path) -> list[str]:
    """What a script must not do, with its line: touch ``sys.path`` (the editable install and
    ``python -m`` from the root make the repo importable), run code held in a string (a ``"-c"``
    in a command list: a ``python -m`` module instead, which the walk above can read), or import
    from ``tests/`` (helpers that benchmarks share live in ``scripts/``)."""
    found = []
    for node in ast.walk(ast.parse((root / path).read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "path":
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{path}:{node.lineno} sys.path")
        elif isinstance(node, ast.List | ast.Tuple):
            if any(isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts):
                found.append(f"{path}:{node.lineno} runs code from a string (-c)")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if any(n and n.split(".")[0] == "tests" for n in names):
                found.append(f"{path}:{node.lineno} imports from tests/")
    return found


# --- the rules on this repository -------------------------------------------------------------
def test_no_import_circle_in_convert_readers_scripts() -> None:
    cycles = ImportGraph(ROOT, LAYERS).cycles()
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_scripts_edit_no_sys_path_hold_no_code_in_strings_import_nothing_from_tests() -> None:
    scripts = sorted(p.relative_to(ROOT) for p in (ROOT / "scripts").rglob("*.py"))
    assert Path("scripts/bench/read.py") in scripts, "the benchmarks moved: the walk is stale"
    smells = [smell for path in scripts for smell in script_smells(ROOT, path)]
    assert not smells, "\n".join(smells)


def test_library_takes_no_private_name_from_another_module() -> None:
    reaches = ImportGraph(ROOT, LIBRARY).reaches(LIBRARY)
    assert not reaches, "private names taken across modules:\n" + "\n".join(map(str, reaches))


# --- the walker finds what it should, on small trees ------------------------------------------
def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


CIRCLES = {
    "through a function-level import": (
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    import pkg.b  # noqa\n",
            "pkg/b.py": "from pkg.a import f\n",
        },
        "pkg",
        "pkg/a.py:2 -> pkg/b.py:1 -> pkg/a.py",
    ),
    "between scripts, by names found beside the script": (
        {
            "scripts/one.py": "import two\n",
            "scripts/two.py": "from one import X\n",
            "scripts/three.py": "import json\nfrom two import Y\n",
        },
        "scripts",
        "scripts/one.py:1 -> scripts/two.py:1 -> scripts/one.py",
    ),
    "between modules of a package under scripts/, by their names from the root": (
        {
            "scripts/bench/__init__.py": "",
            "scripts/bench/a.py": "from scripts.bench import b\n",
            "scripts/bench/b.py": "import json\nfrom scripts.bench.a import X\n",
            "scripts/tool.py": "from scripts.bench.a import X\n",
        },
        "scripts",
        "scripts/bench/a.py:1 -> scripts/bench/b.py:2 -> scripts/bench/a.py",
    ),
    "through a name taken from the package's __init__ (not a submodule)": (
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg.b import B\nclass A: ...\n",
            "pkg/b.py": "from pkg import helper\nB = 1\n",
            "pkg/ok.py": "from pkg.a import A\nfrom pkg import b\n",
        },
        "pkg",
        "pkg/__init__.py:1 -> pkg/a.py:1 -> pkg/b.py:1 -> pkg/__init__.py",
    ),
}


@pytest.mark.parametrize("files, folder, circle", CIRCLES.values(), ids=CIRCLES)
def test_a_circle_is_reported_with_its_import_lines(
    tmp_path: Path, files: dict[str, str], folder: str, circle: str
) -> None:
    assert ImportGraph(write(tmp_path, files), [folder]).cycles() == [circle]


def test_importing_a_sibling_inside_its_package_is_no_edge_to_the_package(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg.b import B\nfrom pkg import c\nclass A: ...\n",
            "pkg/b.py": "import pkg.c\nB = 1\n",
            "pkg/c.py": "",
        },
    )
    assert ImportGraph(root, ["pkg"]).cycles() == []


def test_a_bare_name_in_a_package_under_scripts_is_not_looked_up_beside_it(tmp_path: Path) -> None:
    """``python -m scripts.bench.a`` puts the root on ``sys.path``, not ``scripts/bench/``: a bare
    ``import b`` there does not import its sibling (and so makes no circle)."""
    root = write(
        tmp_path,
        {
            "scripts/bench/__init__.py": "",
            "scripts/bench/a.py": "import b\n",
            "scripts/bench/b.py": "import a\n",
        },
    )
    graph = ImportGraph(root, ["scripts"])
    assert graph.cycles() == []
    assert graph.edges()[Path("scripts/bench/a.py")] == {}


SMELLS = {
    "sys.path.insert(0, '.')": "sys.path",
    "subprocess.run([sys.executable, '-c', CODE])": "runs code from a string (-c)",
    "from tests.s3_server import local_s3_server": "imports from tests/",
    "import tests.photos": "imports from tests/",
}


@pytest.mark.parametrize("line, smell", SMELLS.items(), ids=SMELLS)
def test_script_smells_are_found(tmp_path: Path, line: str, smell: str) -> None:
    root = write(tmp_path, {"scripts/bench/x.py": f"import sys\n{line}\n"})
    assert script_smells(root, Path("scripts/bench/x.py")) == [f"scripts/bench/x.py:2 {smell}"]


def test_a_plain_subprocess_or_option_named_c_is_no_smell(tmp_path: Path) -> None:
    text = "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'scripts.bench.a'])\n"
    text += "parser.add_argument('-c', '--count')\n"
    root = write(tmp_path, {"scripts/x.py": text})
    assert script_smells(root, Path("scripts/x.py")) == []


@pytest.mark.parametrize(
    "line",
    [
        "from pkg.a import _hidden",
        "from .a import _hidden",
        "import pkg.a\npkg.a._hidden()",
        "from pkg import a\na._hidden",
        "import pkg.a as m\nm._hidden",
    ],
)
def test_private_reach_ins_are_found(tmp_path: Path, line: str) -> None:
    root = write(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "_hidden = 1\n", "pkg/b.py": line + "\n"}
    )
    reaches = ImportGraph(root, ["pkg"]).reaches(["pkg"])
    assert [(str(r.source), r.owner.as_posix(), r.name) for r in reaches] == [
        ("pkg/b.py", "pkg/a.py", "_hidden")
    ]


def test_own_private_names_dunders_and_public_names_are_not_reach_ins(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            "pkg/__init__.py": "__version__ = '1'\n",
            "pkg/a.py": "_own = 1\nprint(_own)\nvisible = 2\n",
            "pkg/b.py": "import pkg\nfrom pkg.a import visible\nprint(pkg.__version__)\n"
            "class C:\n    def f(self):\n        return self._x\n",
        },
    )
    assert ImportGraph(root, ["pkg"]).reaches(["pkg"]) == []
