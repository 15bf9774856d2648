"""Doctest set-up. Public objects report ``__module__ == "stoker"``, so their doctests are
collected once, through ``stoker/__init__.py``, where ``np`` is provided here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _doctest_numpy(doctest_namespace: dict[str, Any]) -> None:
    doctest_namespace["np"] = np
