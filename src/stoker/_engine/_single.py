"""The single-process iterator: fetch, collate and (optionally) pin in the main process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stoker._engine._pin import pin

if TYPE_CHECKING:
    from stoker._loader import DataLoader


class SingleProcessIterator:
    """One epoch of a DataLoader with ``num_workers=0``, batch by batch on ``__next__``."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._loader = loader
        self._tasks = loader._tasks()
        self._fetch = loader._make_fetcher().fetch
        self._pin_device = loader._resolved_pin_device()
        self._iterable = loader._iterable
        self._yielded = 0

    def __iter__(self) -> SingleProcessIterator:
        return self

    def __next__(self) -> Any:
        data = self._fetch(next(self._tasks))
        if self._pin_device is not None:
            data = pin(data, self._pin_device)
        self._yielded += 1
        if self._iterable:
            self._loader._warn_if_iterable_overran(self._yielded)
        return data

    def __len__(self) -> int:
        return len(self._loader)
