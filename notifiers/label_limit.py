"""Counters by profile and subscriber whose number of series stays bounded.

A label per profile finds the noisy rule, but profiles come and go by the thousand in some
installations, and every label value is a series Prometheus keeps. `TopCounter` gives its own
series to at most `limit` label sets — the most counted ones — and counts the rest as
`OTHER`. Each series it shows holds the exact count of its label set since the process
started, whether or not it had a series all along; `OTHER` counts what was counted while its
label set had none. So every series only grows (rates stay right); a label set takes the
place of the least counted one once it is counted `PROMOTE` times as often.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

OTHER = "_other"  # no profile or subscriber id starts with "_"
NONE = ""  # a notification without a subscriber
DEFAULT_LIMIT = 50
PROMOTE = 1.1
KEEP = 100_000  # label sets counted exactly; beyond, new ones count as OTHER only

Key = tuple[str, ...]


class TopCounter:
    """A counter family with bounded labels (``profile``, ``subscriber``) and fixed ones
    (``outcome``: few values), registered in ``registry``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        bounded: Sequence[str],
        fixed: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.bounded, self.fixed = tuple(bounded), tuple(fixed)
        self.limit = limit
        self._lock = threading.Lock()
        self._total: dict[Key, float] = {}  # bounded label set -> its count
        self._by: dict[tuple[Key, Key], float] = {}  # (bounded, fixed) -> its count
        self._other: dict[Key, float] = {}  # fixed -> count while the set had no series
        self._shown: set[Key] = set()
        if registry is not None:
            registry.register(self)  # type: ignore[arg-type]

    def inc(self, bounded: Key, fixed: Key = (), amount: float = 1.0) -> None:
        with self._lock:
            known = bounded in self._total or len(self._total) < KEEP
            if known:
                self._total[bounded] = self._total.get(bounded, 0.0) + amount
                self._by[bounded, fixed] = self._by.get((bounded, fixed), 0.0) + amount
                if bounded not in self._shown:
                    self._admit(bounded)
            if bounded not in self._shown:
                self._other[fixed] = self._other.get(fixed, 0.0) + amount

    def _admit(self, key: Key) -> None:
        if len(self._shown) < self.limit:
            self._shown.add(key)
            return
        if not self._shown:
            return
        least = min(self._shown, key=self._total.__getitem__)
        if self._total[key] > PROMOTE * self._total[least]:
            self._shown.discard(least)
            self._shown.add(key)

    def set_limit(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            while len(self._shown) > limit:
                self._shown.discard(min(self._shown, key=self._total.__getitem__))

    def collect(self) -> Iterator[CounterMetricFamily]:
        fam = CounterMetricFamily(
            self.name, self.documentation, labels=[*self.bounded, *self.fixed]
        )
        with self._lock:
            for (bounded, fixed), value in sorted(self._by.items()):
                if bounded in self._shown:
                    fam.add_metric([*bounded, *fixed], value)
            for fixed, value in sorted(self._other.items()):
                fam.add_metric([OTHER] * len(self.bounded) + list(fixed), value)
        yield fam
