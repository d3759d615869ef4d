"""`notifiers.label_limit.TopCounter`: series per profile bounded, each one only growing."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from notifiers.label_limit import OTHER, TopCounter

pytestmark = pytest.mark.fast  # in-process: `make test-fast` runs it


def series(c: TopCounter) -> dict[tuple[str, ...], float]:
    fam = next(iter(c.collect()))
    return {tuple(s.labels.values()): s.value for s in fam.samples}


def test_the_most_counted_get_series_and_the_rest_other() -> None:
    c = TopCounter("t", "test", bounded=("profile",), fixed=("outcome",), limit=2)
    c.inc(("a",), ("ok",))
    c.inc(("b",), ("ok",))
    c.inc(("noisy",), ("ok",))  # the limit is reached: counted as other
    assert series(c) == {("a", "ok"): 1, ("b", "ok"): 1, (OTHER, "ok"): 1}
    c.inc(("noisy",), ("ok",))  # now counted more than a and b: takes the place of one
    c.inc(("noisy",), ("bad",))
    now = series(c)
    assert now[("noisy", "ok")] == 2 and now[("noisy", "bad")] == 1  # its exact count
    assert len({k[0] for k in now}) == 3  # two pairs and other
    before = now
    for _ in range(20):  # whatever comes and goes, no series ever shrinks
        for pid in ("a", "b", "c", "noisy"):
            c.inc((pid,), ("ok",))
            after = series(c)
            assert all(after.get(k, v) >= v for k, v in before.items())
            before = after
    assert len({k[0] for k in before}) <= 3


def test_limit_zero_counts_everything_as_other_and_registers() -> None:
    reg = CollectorRegistry()
    c = TopCounter("ens_t", "test", bounded=("profile", "subscriber"), registry=reg, limit=0)
    c.inc(("a", "s"))
    c.inc(("b", ""))
    assert series(c) == {(OTHER, OTHER): 2}
    assert b'ens_t_total{profile="_other",subscriber="_other"} 2.0' in generate_latest(reg)
    c.set_limit(5)
    c.inc(("a", "s"))
    assert series(c)[("a", "s")] == 2
