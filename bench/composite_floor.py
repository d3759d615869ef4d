"""The floor of completing a composite: a completion written for exactly the bench shape.

Replaces the composite runtime's event handler, for the completing events only, by the
least work a completion needs (drop the one partial match, retire its auxiliary profile,
append the notification) and compares it with the engine in the cold harness of
bench/composite.py. An experiment, not engine code: `python bench/composite_floor.py`.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

from bench.composite import build_engine
from filters.eager.auxiliary import VARIANTS
from filters.eager.composite import CompositeRuntime
from profiles.events import Event

_ORIGINAL = CompositeRuntime.on_event


def _minimal_completion(self: Any, ev: Event, seq: int, leaves: list[int]) -> None:
    part = self.parts[()]
    pm = part.pms[0]
    first = pm.binds[0].ev
    eng = self.engine
    for key in pm.regs:
        if eng.variant == "references":
            part.regs[key] = 0  # dormant
            part.dormant += 1
            continue
        del part.regs[key]
        if eng.variant == "dynamic":
            eng.pool.release(part.entries.pop(key), (self.idx, 1))
    pm.alive = False
    part.pms.clear()
    if eng.variant == "dynamic":
        del self.parts[()]
    self.pm_count -= 1
    self.report(ev.ts, {"a": first, "b": ev}, None)


def _median_us(xs: list[int]) -> float:
    return sorted(xs)[len(xs) // 2] / 1000


def run(variant: str, minimal: bool, rounds: int = 6, batch: int = 2000) -> float:
    """Print and return last/primitive for the engine or the minimal completion."""
    eng = build_engine(10000, 10000, "", variant)
    rng = random.Random(1)
    clock = time.perf_counter_ns
    prim: list[int] = []
    last: list[int] = []
    gc.collect()
    gc.freeze()
    t = 0.0
    try:
        for _ in range(rounds):
            ids = rng.sample(range(10000), batch)
            t += 1
            CompositeRuntime.on_event = _ORIGINAL  # type: ignore[method-assign]
            for i in ids:
                eng.process(Event(f"a{t}-{i}", t, {"kind": "A", "x": i}))
            eng.take_notifications()
            if minimal:
                CompositeRuntime.on_event = _minimal_completion  # type: ignore[method-assign]
            t += 1
            for i in ids:
                p = Event(f"p{t}-{i}", t, {"kind": "P", "x": rng.randrange(10000)})
                b = Event(f"b{t}-{i}", t, {"kind": "B", "x": i})
                t0 = clock()
                eng.process(p)
                t1 = clock()
                eng.process(b)
                t2 = clock()
                prim.append(t1 - t0)
                last.append(t2 - t1)
            assert len(eng.take_notifications()) == 2 * batch
    finally:
        CompositeRuntime.on_event = _ORIGINAL  # type: ignore[method-assign]
        gc.unfreeze()
    ratio = _median_us(last) / _median_us(prim)
    print(
        f"{variant:8} {'minimal' if minimal else 'engine':8} primitive {_median_us(prim):.2f} µs "
        f"last {_median_us(last):.2f} µs  ratio {ratio:.2f}"
    )
    return ratio


if __name__ == "__main__":
    for _ in range(2):
        for v in VARIANTS:
            run(v, False)
            run(v, True)
