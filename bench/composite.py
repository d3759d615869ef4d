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

# label -> (parameters appended to each composite, whether events carry a room and it is `per room`)
PARAMS: dict[str, tuple[str, bool]] = {
    "first/unique": ("", False),
    "each/shared": (" select each consume shared", False),
    "first/unique per room": (" per room", True),
}


def build_engine(
    n_comp: int, n_prim: int, params: str, variant: str = Engine.DEFAULT_VARIANT
) -> Engine:
    profiles = [parse_profile(f'kind = "P" and x = {i}', f"prim{i}") for i in range(n_prim)]
    profiles += [
        parse_profile(
            f'seq(a: kind = "A" and x = {i}, b: kind = "B" and x = {i}) within 1h{params}',
            f"comp{i}",
        )
        for i in range(n_comp)
    ]
    return Engine(profiles, variant=variant)


def attrs_of(kind: str, x: int, per_room: bool) -> dict:
    """A room (one of the KETI building's 51) only where the profiles partition by it."""
    return {"kind": kind, "x": x, "room": f"r{x % 51}"} if per_room else {"kind": kind, "x": x}


def _med(xs: list[int]) -> float:
    return sorted(xs)[len(xs) // 2] / 1000


def _result(
    label: str,
    variant: str,
    n_comp: int,
    n_prim: int,
    times: dict[str, list[int]],
    notes: tuple[int, int],
    rate: float,
) -> dict:
    """`measure`'s figures from its samples (ns): medians in µs, ratios, notifications."""
    p, b, a = _med(times["prim"]), _med(times["last"]), _med(times["first"])
    notes_prim, notes_last = notes
    return {
        "params": label,
        "variant": variant,
        "composites": n_comp,
        "primitives": n_prim,
        "primitive_us": round(p, 2),
        "first_component_us": round(a, 2),
        "last_component_us": round(b, 2),
        "ratio_last_vs_primitive": round(b / p, 2),
        "filter_only_ratio": round(_med(times["last_f"]) / _med(times["prim_f"]), 2),
        "notifications_per_last_event": round(notes_last / len(times["last"]), 2),
        "notifications_per_primitive_event": round(notes_prim / len(times["prim"]), 2),
        "stream_events_per_s": round(rate),
    }


def measure(
    n_comp: int,
    n_prim: int,
    label: str,
    rounds: int,
    batch: int,
    seed: int,
    variant: str = Engine.DEFAULT_VARIANT,
) -> dict:
    """Per-event times; primitive and completing events alternate so both see the same machine load.

    Even rounds time `process()` of events the engine has not seen (as in a stream); odd rounds
    time the pool's match alone, then process the events untimed. (Timing both on the same
    event would warm the caches for the second measurement.)
    """
    params, per_room = PARAMS[label]
    eng = build_engine(n_comp, n_prim, params, variant)
    gc.collect()
    gc.freeze()
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    t = 0.0
    prim: list[int] = []
    last: list[int] = []
    first: list[int] = []
    prim_f: list[int] = []  # the filtering step alone (pool match) for the same events
    last_f: list[int] = []
    notes_last = notes_prim = 0
    t_all0 = time.perf_counter()
    n_all = 0
    for rnd in range(rounds):
        end_to_end = rnd % 2 == 0
        ids = rng.sample(range(n_comp), batch)
        t += 1
        for i in ids:
            ev = Event(f"a{t}-{i}", t, attrs_of("A", i, per_room))
            t0 = clock()
            eng.process(ev)
            first.append(clock() - t0)
        eng.take_notifications()
        t += 1
        for i in ids:
            p_ev = Event(f"p{t}-{i}", t, attrs_of("P", rng.randrange(n_prim), per_room))
            b_ev = Event(f"b{t}-{i}", t, attrs_of("B", i, per_room))
            if not end_to_end:
                t0 = clock()
                eng.pool.match(p_ev.attrs)
                prim_f.append(clock() - t0)
                t0 = clock()
                eng.pool.match(b_ev.attrs)
                last_f.append(clock() - t0)
                eng.process(p_ev)
                eng.process(b_ev)
                eng.take_notifications()
                continue
            t0 = clock()
            eng.process(p_ev)
            prim.append(clock() - t0)
            notes_prim += len(eng.take_notifications())
            t0 = clock()
            eng.process(b_ev)
            last.append(clock() - t0)
            notes_last += len(eng.take_notifications())
        n_all += 3 * batch
    elapsed = time.perf_counter() - t_all0
    gc.unfreeze()

    times = {"prim": prim, "last": last, "first": first, "prim_f": prim_f, "last_f": last_f}
    return _result(label, variant, n_comp, n_prim, times, (notes_prim, notes_last), n_all / elapsed)


def run(
    n_comp: int, n_prim: int, rounds: int, batch: int, seed: int, variants: list[str]
) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    rows = []
    for label in PARAMS:
        for variant in variants:
            with Console(stderr=True).status(
                f"{label} {variant}: {n_comp:,} composites + {n_prim:,} primitives…"
            ):
                rows.append(measure(n_comp, n_prim, label, rounds, batch, seed, variant))
    table = Table(title="last event of a composite vs a primitive event (medians, same run)")
    for key in rows[0]:
        whole = key in ("params", "variant")  # kept whole; the figures' headers wrap instead
        table.add_column(key.replace("_", " "), justify="left" if whole else "right", no_wrap=whole)
    for r in rows:
        table.add_row(*[f"{v:,}" if isinstance(v, int) else str(v) for v in r.values()])
    Console(width=160).print(table)
    return rows
