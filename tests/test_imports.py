"""stoker's modules import each other one way: the graph, read from the sources, has no cycle.

Every ``import`` and ``from ... import`` of a stoker module counts, at module level and
inside functions alike (a deferred import is still a dependency). Imports under
``if TYPE_CHECKING:`` (they never run, and exist only for annotations) count in a second
graph, which must be acyclic too: a type-only cycle is still two modules that need each
other to be read. Not counted: the implicit import of a module's parent packages
(``stoker``'s ``__init__`` imports most modules, and every module is inside it; that is
not a dependency of one part on another).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT = "stoker"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str, type_only: bool = False) -> set[tuple[str, str]]:
    """(module, name) for each name this module imports (under TYPE_CHECKING too, with
    ``type_only``); name is "" for ``import module``."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.update((module, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """stoker module -> the stoker modules it imports (``type_only``: counting the imports
    under TYPE_CHECKING too).

    ``from package import name`` depends on the submodule ``package.name`` where there is
    one (a C extension's too, which imports nothing back), else on the package itself.
    """
    paths = {_module_name(p): p for p in (SRC / ROOT).rglob("*.py")}
    extensions = {_module_name(p) for p in (SRC / ROOT).rglob("*.pyi")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        deps: set[str] = set()
        for module, member in _imports(tree, package, type_only):
            sub = f"{module}.{member}"
            if member and (sub in paths or sub in extensions):
                deps.add(sub)
            else:
                deps.add(module)
        graph[name] = {m for m in deps if m in paths and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None where it is acyclic."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_finder_sees_a_cycle_and_its_absence() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_reader_counts_deferred_and_relative_imports_not_type_checking_ones() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from . import _b\n"
        "from .._c import x\n"
        "if TYPE_CHECKING:\n"
        "    from stoker._d import D\n"
        "def f():\n"
        "    import stoker._e\n"
    )
    found = {module for module, _ in _imports(tree, "stoker._engine")}
    assert {"stoker._engine", "stoker._c", "stoker._e"} <= found
    assert "stoker._d" not in found


def test_the_graph_covers_the_engine_and_the_loader() -> None:
    graph = import_graph()
    assert "stoker._engine._multi" in graph["stoker._loader"]
    assert "stoker._osprobe" in graph["stoker._autotune"]


def test_stoker_imports_have_no_cycle() -> None:
    cycle = find_cycle(import_graph())
    if cycle is not None:
        pytest.fail(
            "stoker's modules must import one way (loader -> engine -> pure parts), but "
            f"they import in a cycle: {' -> '.join(cycle)}. Move what both need into a "
            "module that neither imports back, or hand it in as an argument."
        )


def test_stoker_imports_have_no_cycle_counting_type_only_ones() -> None:
    cycle = find_cycle(import_graph(type_only=True))
    if cycle is not None:
        pytest.fail(
            "stoker's modules must not need each other even for annotations, but their "
            f"imports (those under TYPE_CHECKING counted) form a cycle: {' -> '.join(cycle)}. "
            "Move the type both name into a module that neither imports back, or describe "
            "what is needed with a Protocol in the module that uses it."
        )
