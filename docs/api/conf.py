"""Sphinx configuration of stoker's API reference (``docs/api``).

Built by ``.ci/run`` with warnings as errors::

    python -m sphinx -W --keep-going -q -b html docs/api build/docs
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sphinx.application import Sphinx

# Document the source beside this file (the checkout), whatever else is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

project = "stoker"
author = "stoker's authors"
copyright = "stoker's authors, Apache-2.0"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
html_theme = "furo"
html_title = "stoker API reference"
exclude_patterns: list[str] = []
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
default_role = "code"


def _plain_bases(app: Sphinx, name: str, obj: type, options: Any, bases: list[Any]) -> None:
    """Name each base of a class by its full public path (``stoker.DataLoader``,
    ``torch.utils.data.dataloader.DataLoader``), without its type parameters: stoker.torch's
    classes have two bases of the same short name."""
    names = []
    for base in bases:
        cls = getattr(base, "__origin__", base)
        names.append(f":py:class:`{cls.__module__}.{cls.__qualname__}`")
    bases[:] = names


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-bases", _plain_bases)
