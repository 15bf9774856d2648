"""No function in ``src/stoker`` runs over 60 lines, so that each reads in one sitting.

Lines are counted from ``def`` to the function's last line, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "stoker"
MAX_LINES = 60

ALLOWED = {
    # argument validation of torch's signature, allowed by issue #23
    "_loader.py:DataLoader.__init__",
}


def long_functions(root: Path = SRC, limit: int = MAX_LINES) -> dict[str, int]:
    """Every function under ``root`` over ``limit`` lines, as ``file:Qual.name`` -> lines."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found[f"{rel}:{name}"] = lines
                visit(child, rel, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, rel, prefix + child.name + ".")

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(root).as_posix(), "")
    return found


def test_no_function_is_over_60_lines() -> None:
    """Every function in ``src/stoker`` is at most 60 lines, beyond the allow-list."""
    found = long_functions()
    over = {key: lines for key, lines in found.items() if key not in ALLOWED}
    assert over == {}, over
    stale = sorted(ALLOWED - set(found))
    assert stale == [], f"now short, remove from ALLOWED: {stale}"


def test_the_counter_sees_methods_and_nested_functions(tmp_path: Path) -> None:
    """A long method and a long nested function are found by qualified name; a short one not."""
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    source = f"class A:\n    def m(self):\n{body}\n    def short(self):\n        pass\n"
    source += f"def f():\n    def g():\n{body}"
    (tmp_path / "m.py").write_text(source)
    assert long_functions(tmp_path) == {
        "m.py:A.m": MAX_LINES + 1,
        "m.py:f": MAX_LINES + 2,
        "m.py:f.g": MAX_LINES + 1,
    }


def test_the_worker_iterator_reads_in_one_sitting() -> None:
    """The worker-backed iterator is a coordinator under 250 lines: the reorder window, the
    dispatch and split batches live in modules of their own (issue #23)."""
    tree = ast.parse((SRC / "_engine" / "_multi.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert cls.name == "MultiWorkerIterator"
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno + 1 < 250


def test_no_engine_module_is_over_500_lines() -> None:
    """Each module of ``stoker._engine`` holds one concept and reads in a sitting: at most
    500 lines (issue #33 split the pool, the worker, the transport and shared memory)."""
    long = {
        path.name: n
        for path in sorted((SRC / "_engine").glob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}, long
