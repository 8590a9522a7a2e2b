"""The package's layers import only downward, and no module imports itself back in a circle.

Read from the source with ``ast`` (nothing is imported, so no torch): every ``import`` of a
``shardbench`` module counts, at the top of a file or inside a function, under TYPE_CHECKING or
not, since each is a dependency the lower layer would then have on the higher one.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the layers, highest first: a module imports only from its own layer or those below it.
#: The ground floor holds what every layer reads: the package's own ``__init__`` (the public
#: names, imported lazily), the record schema, safe paths, and small helpers of no layer.
#: ``python -m shardbench`` (``__main__``) is the command line's. Prediction shares the
#: harness's floor: it reads the cell and the machine's cores from the harness's config, and
#: the harness writes its predictions into each record.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__"),
    ("report",),
    ("studies",),
    ("harness", "prediction"),
    ("integrations",),
    ("strategies",),
    ("metrics", "models"),
    (
        "",
        "records",
        "step_figures",
        "paths",
        "precision",
        "tensors",
        "blocks",
        "units",
        "wording",
        "core_binding",
    ),
)


def package_dirs() -> dict[str, Path]:
    """``shardbench`` package -> its folder, as pyproject's ``package-dir`` maps them."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = setuptools["package-dir"]
    out = {}
    for package in setuptools["packages"]:
        base = max((p for p in mapped if package == p or package.startswith(p + ".")), key=len)
        rest = package[len(base) :].lstrip(".").replace(".", "/")
        out[package] = ROOT / mapped[base] / rest
    return out


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in package_dirs().items():
        for path in folder.glob("*.py"):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The shardbench modules ``name`` (at ``path``) imports, resolved to modules in ``known``."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("shardbench") and target != name:
                yield target


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: in no layer; add its top-level name to LAYERS")


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: set(imported(name, path, set(found))) for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_folder_of_the_package_is_installed() -> None:
    """A folder with an ``__init__.py`` that pyproject does not list would be left out of the
    wheel (and out of this test's graph)."""
    listed = {folder.resolve() for folder in package_dirs().values()}
    for top in ("bench", "models"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert init.parent.resolve() in listed, f"{init.parent} is not in pyproject's packages"


def test_no_import_climbs_a_layer() -> None:
    edges = graph()
    assert len(edges) > 100  # the walk found the package
    climbs = [f"{m} -> {d}" for m, deps in sorted(edges.items()) for d in sorted(deps) if layer(d) < layer(m)]
    assert not climbs, "imports from a lower layer to a higher one:\n" + "\n".join(climbs)


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_see_a_climb_and_a_circle() -> None:
    """The two checks themselves: a made-up graph with one of each."""
    edges = {
        "shardbench.records": {"shardbench.cli.run"},
        "shardbench.cli.run": {"shardbench.records"},
    }
    assert layer("shardbench.records") > layer("shardbench.cli.run")
    assert circles(edges) == [["shardbench.cli.run", "shardbench.records"]]
