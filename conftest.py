"""Doctest set-up. Public objects report ``__module__ == "stoker"`` (or ``stoker.torch``,
``stoker.vision``, ``stoker.formats``), so their doctests are collected once, through the
public package's ``__init__.py``: the public names (loaded lazily) are loaded here first,
and ``np`` is provided.

A method keeps its private module, so doctest's finder skips its examples in both places;
:func:`method_examples` lists them in the public package's ``__test__``, where they run.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import stoker

for _name in stoker.__all__:
    getattr(stoker, _name)

_SRC = Path(__file__).resolve().parent / "src"
_PUBLIC = ("stoker", "stoker.torch", "stoker.vision", "stoker.formats")


def method_examples(module: ModuleType) -> dict[str, Any]:
    """``Class.method`` -> the function, for each method (or property, class or static
    method) of a public class of ``module`` whose docstring has an example and whose own
    ``__module__`` is not ``module``'s."""
    found: dict[str, Any] = {}
    for name in module.__all__:
        cls = getattr(module, name)
        if not isinstance(cls, type) or cls.__module__ != module.__name__:
            continue
        for attr, value in vars(cls).items():
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            doc = getattr(func, "__doc__", None) or ""
            if callable(func) and ">>>" in doc and func.__module__ != module.__name__:
                found[f"{name}.{attr}"] = func
    return found


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """Before a public package's ``__init__.py`` is collected, put its classes' method
    examples in its ``__test__``."""
    for name in _PUBLIC:
        if file_path == _SRC.joinpath(*name.split("."), "__init__.py"):
            try:
                module = importlib.import_module(name)
            except ImportError:  # an extra (torch, Pillow) is not installed: pytest says so
                return
            module.__test__ = {**getattr(module, "__test__", {}), **method_examples(module)}


@pytest.fixture(autouse=True)
def _doctest_numpy(doctest_namespace: dict[str, Any]) -> None:
    doctest_namespace["np"] = np
