"""Doctest set-up. Public objects report ``__module__ == "stoker"``, so their doctests are
collected once, through ``stoker/__init__.py``: the public names (loaded lazily) are loaded
here first, and ``np`` is provided."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import stoker

for _name in stoker.__all__:
    getattr(stoker, _name)


@pytest.fixture(autouse=True)
def _doctest_numpy(doctest_namespace: dict[str, Any]) -> None:
    doctest_namespace["np"] = np
