"""What the cyclic garbage collector costs per event with a large engine, with and without
``gc.freeze()`` after loading (issue 17 item 15; docs/benchmarks.md).

One engine of ``2 n`` profiles (``bench.composite``'s per-room mix) is built once; blocks of
events then alternate between "no-freeze" and "freeze" so both see the same machine load and
the same growing state. CPU time (not wall time) per event, and the part of it spent in
collections (``gc.callbacks``).

    python -m bench.gc_freeze [N] [EVENTS_PER_BLOCK]     # default 50000 150000
"""

from __future__ import annotations

import gc
import random
import sys
import time
from typing import Any

from bench.composite import attrs_of, build_engine
from profiles.events import Event


def main(n: int = 50_000, per_block: int = 150_000) -> list[dict[str, Any]]:
    eng = build_engine(n, n, " per room")
    rng = random.Random(1)
    spent = {"gc": 0.0, "full": 0, "t0": 0.0}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent["t0"] = time.process_time()
            return
        spent["gc"] += time.process_time() - spent["t0"]
        spent["full"] += info["generation"] == 2

    gc.callbacks.append(on_gc)
    gc.collect()
    print(f"{2 * n} profiles, {len(gc.get_objects()):,} objects tracked by gc")
    rows = []
    t = 0.0
    for mode in ("no-freeze", "freeze", "no-freeze", "freeze"):
        if mode == "freeze":
            gc.collect()
            gc.freeze()
        spent.update(gc=0.0, full=0)
        c0 = time.process_time()
        for _ in range(per_block // 3):
            i = rng.randrange(n)
            t += 1
            eng.process(Event(f"a{t}", t, attrs_of("A", i, True)))
            eng.process(Event(f"p{t}", t, attrs_of("P", rng.randrange(n), True)))
            eng.process(Event(f"b{t}", t, attrs_of("B", i, True)))
            eng.take_notifications()
        cpu = time.process_time() - c0
        gc.unfreeze()
        row = {
            "mode": mode,
            "us_per_event": round(cpu / per_block * 1e6, 2),
            "gc_us_per_event": round(spent["gc"] / per_block * 1e6, 2),
            "full_collections": spent["full"],
        }
        print(row)
        rows.append(row)
    gc.callbacks.remove(on_gc)
    return rows


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
