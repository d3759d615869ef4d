"""Adapters that turn real building sensor data sets into ENS events.

Each data set is read as stored (xz/gzip decompressed on the fly) and yields flat event dicts::

    {"id": "keti:413:co2:1377299107", "ts": 1377299107.0, "building": "SDH", "room": "413",
     "sensor": "keti-413-co2", "kind": "co2", "value": 488.0, "unit": "ppm"}

plus ``suspect: true`` on physically implausible readings, which are kept, not dropped (rules
in :mod:`adapters.datasets.common`). Ids are ``<data set>:<room>:<channel>:<time>`` and stable
across runs. Streams are in time order. See docs/datasets.md for the attribute mapping tables.

Usage::

    from adapters.datasets import DATASETS, iter_dataset
    for ev in iter_dataset("keti", "examples/data/keti", rooms=["419"], kinds=["temperature"]):
        ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from types import ModuleType

from adapters.datasets import keti, uci_appliances, uci_occupancy, uci_sml2010
from adapters.datasets.common import DatasetError, Event

__all__ = ["DATASETS", "DatasetAdapter", "DatasetError", "Event", "get_adapter", "iter_dataset"]


@dataclass(frozen=True)
class DatasetAdapter:
    """One data set: what it is, where it lives, and how to read it into events."""

    name: str
    description: str
    folder: str  # folder name under shared/data and examples/data
    kinds: tuple[str, ...]
    rooms: tuple[str, ...] | None  # None: discovered from the files (KETI)
    local_time: bool  # timestamps are naive wall-clock times, so `tz` applies
    module: ModuleType

    def iter_events(
        self,
        path: Path | str,
        *,
        rooms: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        tz: str | tzinfo | None = None,
    ) -> Iterator[Event]:
        """Events of the data set at `path` in time order.

        `rooms`/`kinds` restrict the stream (unknown values raise DatasetError, so typos are
        not silent), `limit` caps the number of events, `tz` is the zone of naive local
        times (default UTC; DatasetError for KETI, whose files hold UTC epochs).
        Path and filter errors are raised here, reading errors while iterating.
        """
        if limit is not None and limit < 0:
            raise DatasetError("limit must be >= 0")
        kw: dict[str, object] = {"rooms": rooms, "kinds": kinds, "limit": limit}
        if tz is not None:
            if not self.local_time:
                raise DatasetError(f"{self.name} time stamps are UTC epochs; tz does not apply")
            kw["tz"] = tz
        return self.module.iter_events(path, **kw)

    def estimate_events(
        self,
        path: Path | str,
        *,
        rooms: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> int | None:
        """Expected number of events (for progress bars), or None when unknown."""
        return self.module.estimate_events(path, rooms=rooms, kinds=kinds)


def _adapter(module: ModuleType, folder: str, local_time: bool) -> DatasetAdapter:
    rooms = getattr(module, "ROOMS", None)
    return DatasetAdapter(
        module.NAME, module.DESCRIPTION, folder, tuple(module.KINDS), rooms, local_time, module
    )


DATASETS: dict[str, DatasetAdapter] = {
    a.name: a
    for a in (
        _adapter(keti, "keti", local_time=False),
        _adapter(uci_occupancy, "uci-occupancy", local_time=True),
        _adapter(uci_appliances, "uci-appliances-energy", local_time=True),
        _adapter(uci_sml2010, "uci-sml2010", local_time=True),
    )
}


def get_adapter(name: str) -> DatasetAdapter:
    """The adapter called `name`, or DatasetError listing the known names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise DatasetError(f"unknown data set {name!r} (known: {', '.join(DATASETS)})") from None


def iter_dataset(name: str, path: Path | str, **kw: object) -> Iterator[Event]:
    """Shortcut for ``DATASETS[name].iter_events(path, **kw)``."""
    return get_adapter(name).iter_events(path, **kw)  # type: ignore[arg-type]
