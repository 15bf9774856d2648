"""No module of ``src/stoker`` reaches into another module's private members.

A name with a leading underscore is a module's own: its object's ``_state``, its
``_helper``. Read from the sources, an approximation of "an object of a class defined in
another module": ``x._name`` is allowed only where ``x`` is ``self`` or ``cls``, or where
``_name`` is defined in the same module (a method, an attribute set on ``self``, a class
or module member: the module's own classes then), or where it is one of Python's, NumPy's
or torch's own protocol names (:data:`PROTOCOL`), or a member of a module outside stoker
(``sys._getframe``, torch's), or an allowed member of another library's object
(:data:`EXTERNAL`); ``getattr(x, "_name")`` likewise, beyond stoker's own duck-typed
protocols (:data:`MARKERS`). ``from stoker.x import _name`` is allowed only for a module
(``from stoker._engine import _shm``). Dunder names (``__class__``) are public.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "stoker"

PROTOCOL = frozenset(
    {
        "_fields",  # NamedTuple
        "_replace",
        "_asdict",
        "_make",
        "_field_defaults",
        "_is_protocol",  # typing.Protocol
        "_value_",  # enum
        "_name_",
        "_missing_",
    }
)
"""Private by their spelling, public by their library's contract."""
EXTERNAL = frozenset(
    {
        # Accelerate's own protocol between its GradientState and the loaders it prepares,
        # which a prepared stoker loader joins as Accelerate's loaders do
        "_add_dataloader",
        "_remove_dataloader",
    }
)
"""Private members of other libraries' objects that stoker must use, each with its reason."""
MARKERS = frozenset(
    {
        # class attributes a dataset's author sets to tell stoker something
        "_stoker_index_array",
        "_stoker_worker_agnostic",
        # what a sampler (stoker's, a wrapper's, the user's) may define for checkpoints:
        # the state that draws its epoch again; underscored to stay off torch's surface
        "_drawn_state",
        "_pending_state",
        # the cache a dataset reads through (ImageFolder's decoded pixels), for statistics
        "_pixel_cache",
    }
)
"""stoker's own duck-typed protocols, read with ``getattr`` on any object, each documented
where it is read."""
OUTSIDE_ROOTS = frozenset({"torch"})
"""Names that hold a module outside stoker without importing it (``torch =
_torch.loaded()``: torch's own members, private ones included, are torch's business)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_here(tree: ast.AST) -> set[str]:
    """Private names this module defines: functions, classes, assignments (of names, and
    of ``self._x`` / ``cls._x``: not ``other._x = ...``) and annotated class members."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute) and _is_self(sub.value):
                        names.add(sub.attr)
    return {n for n in names if _private(n)}


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _outside_modules(tree: ast.AST) -> set[str]:
    """Names bound to modules outside stoker: by ``import x`` / ``import x as y``, and by
    ``y = x.a.b`` from such a name (``worker = torch.utils.data._utils.worker``)."""
    bound: set[str] = set(OUTSIDE_ROOTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("stoker"):
                    bound.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if (
            isinstance(node, ast.Assign)
            and isinstance(value, ast.Attribute)
            and _root(value) in bound
        ):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return bound


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``getattr(x, ...)`` read as ``x.``)."""
    while isinstance(node, ast.Attribute) or _getattr_name(node) is not None:
        node = node.value if isinstance(node, ast.Attribute) else node.args[0]  # type: ignore[attr-defined]
    return node.id if isinstance(node, ast.Name) else None


def _getattr_name(node: ast.AST) -> str | None:
    """The attribute name of ``getattr(x, "name", ...)`` / ``hasattr(x, "name")``, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id not in ("getattr", "hasattr") or len(node.args) < 2:
        return None
    arg = node.args[1]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def reaches(path: Path, root: Path = SRC) -> list[str]:
    """Each private reach of the module at ``path``, as ``file:line: text``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own, outside = _defined_here(tree), _outside_modules(tree)
    rel = path.relative_to(root).as_posix()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = _root(node.value)
            if _is_self(node.value):
                continue
            if node.attr in own or node.attr in PROTOCOL or node.attr in EXTERNAL:
                continue
            if base in outside:
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif (name := _getattr_name(node)) is not None and _private(name):
            base = _root(node.args[0])  # type: ignore[attr-defined]
            if _is_self(node.args[0]) or base in outside:  # type: ignore[attr-defined]
                continue
            if name in own or name in MARKERS or name in PROTOCOL:
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stoker"):
            for alias in node.names:
                sub = root.parent.joinpath(*f"{node.module}.{alias.name}".split("."))
                is_module = sub.is_dir() or any(sub.parent.glob(sub.name + ".*"))  # C ones too
                if _private(alias.name) and not is_module:
                    found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_no_module_reaches_into_another_modules_private_members() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py")) for hit in reaches(path)]
    assert found == [], (
        "a module reaches into another module's private members; give the owner a "
        "public method or name for what is needed:\n" + "\n".join(found)
    )


def test_the_finder_sees_a_reach_and_lets_own_names_pass(tmp_path: Path) -> None:
    """A reach into another object's private attribute is found; ``self``'s, a name the
    module defines, a NamedTuple's ``_replace`` and ``sys._getframe`` pass."""
    (tmp_path / "m.py").write_text(
        "import sys\n"
        "from stoker._x import _helper\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, other, row):\n"
        "        sys._getframe(0)\n"
        "        row._replace(a=1)\n"
        "        other._mine\n"
        "        other._set = 2\n"
        "        getattr(other, '_hidden', None)\n"
        "        return other._theirs\n"
    )
    assert reaches(tmp_path / "m.py", tmp_path) == [
        "m.py:2: from stoker._x import _helper",
        "m.py:10: other._set",
        "m.py:11: getattr(other, '_hidden', None)",
        "m.py:12: other._theirs",
    ]
