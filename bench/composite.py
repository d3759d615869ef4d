"""Cost of the last event of a composite vs a primitive event (`ens bench composite`).

CompAS' claim: with single-step filtering, the event that completes a
composite costs about what filtering a primitive event costs, because the
composite is waiting for it as an auxiliary profile in the same pool.
"""

from __future__ import annotations

import gc
import random
import time

from filters.engine import Engine
from profiles.events import Event
from profiles.parser import parse_profile

PARAMS = {"first/unique": "", "each/shared": " select each consume shared"}


def _engine(n_comp: int, n_prim: int, params: str) -> Engine:
    profiles = [parse_profile(f'kind = "P" and x = {i}', f"prim{i}") for i in range(n_prim)]
    profiles += [
        parse_profile(f'seq(a: kind = "A" and x = {i}, b: kind = "B" and x = {i}) within 1h{params}', f"comp{i}")
        for i in range(n_comp)
    ]
    return Engine(profiles)


def _time(eng: Engine, events: list[Event]) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for ev in events:
        eng.process(ev)
        n += len(eng.take_notifications())
    return (time.perf_counter() - t0) / len(events) * 1e6, n


def measure(n_comp: int, n_prim: int, label: str, rounds: int, batch: int, seed: int) -> dict:
    params = PARAMS[label]
    eng = _engine(n_comp, n_prim, params)
    gc.collect()
    gc.freeze()
    rng = random.Random(seed)
    t = 0.0
    prim_us, last_us, first_us = [], [], []
    notes_last = notes_prim = 0
    for _ in range(rounds):
        ids = rng.sample(range(n_comp), batch)
        t += 1
        starts = [Event(f"a{t}-{i}", t, {"kind": "A", "x": i}) for i in ids]
        us, _ = _time(eng, starts)
        first_us.append(us)
        t += 1
        prims = [Event(f"p{t}-{i}", t, {"kind": "P", "x": rng.randrange(n_prim)}) for i in ids]
        us, n = _time(eng, prims)
        prim_us.append(us)
        notes_prim += n
        t += 1
        lasts = [Event(f"b{t}-{i}", t, {"kind": "B", "x": i}) for i in ids]
        us, n = _time(eng, lasts)
        last_us.append(us)
        notes_last += n
    gc.unfreeze()
    med = sorted
    p = med(prim_us)[len(prim_us) // 2]
    last = med(last_us)[len(last_us) // 2]
    first = med(first_us)[len(first_us) // 2]
    stream_us = (sum(prim_us) + sum(last_us) + sum(first_us)) / (3 * rounds)
    return {
        "params": label,
        "composites": n_comp,
        "primitives": n_prim,
        "primitive_us": round(p, 2),
        "first_component_us": round(first, 2),
        "last_component_us": round(last, 2),
        "ratio_last_vs_primitive": round(last / p, 2),
        "notifications_per_last_event": round(notes_last / (rounds * batch), 2),
        "notifications_per_primitive_event": round(notes_prim / (rounds * batch), 2),
        "stream_events_per_s": round(1e6 / stream_us),
    }


def run(n_comp: int, n_prim: int, rounds: int, batch: int, seed: int) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    rows = []
    for label in PARAMS:
        with Console(stderr=True).status(f"{label}: {n_comp:,} composites + {n_prim:,} primitives…"):
            rows.append(measure(n_comp, n_prim, label, rounds, batch, seed))
    table = Table(title="last event of a composite vs a primitive event (medians, same run)")
    for key in rows[0]:
        table.add_column(key.replace("_", " "), justify="right")
    for r in rows:
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in r.values()])
    Console(width=160).print(table)
    return rows
