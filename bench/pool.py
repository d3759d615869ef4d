"""Benchmark of the primitive pool against naive evaluation (`ens bench pool`).

The profile mix imitates a building: most profiles name a room and a sensor
kind with a threshold or a band, some a whole building, some one sensor, so
each reading concerns a handful of users (about 1 to 10 matches per event).
"""

from __future__ import annotations

import csv
import gc
import os
import random
import time
from pathlib import Path

from filters.compile import compile_filter
from filters.pool.primitive import PrimitivePool
from profiles.ast import And, Between, Cmp, Filter

KINDS = ["temperature", "humidity", "co2", "light", "presence"]


def make_profiles(n: int, rng: random.Random) -> list[Filter]:
    rooms = max(1, n // 20)
    buildings = max(1, n // 200)
    out: list[Filter] = []
    for _ in range(n):
        r = rng.random()
        kind = Cmp("kind", "=", rng.choice(KINDS))
        if r < 0.6:
            room = Cmp("room", "=", f"R{rng.randrange(rooms)}")
            out.append(And((kind, room, Cmp("value", ">", round(rng.uniform(0, 40), 2)))))
        elif r < 0.8:
            room = Cmp("room", "=", f"R{rng.randrange(rooms)}")
            lo = round(rng.uniform(0, 35), 2)
            out.append(And((kind, room, Between("value", lo, round(lo + rng.uniform(1, 5), 2)))))
        elif r < 0.9:
            b = Cmp("building", "=", f"B{rng.randrange(buildings)}")
            out.append(And((b, kind, Cmp("value", ">=", round(rng.uniform(20, 40), 2)))))
        else:
            sensor = Cmp("sensor", "=", f"S{rng.randrange(rooms)}-{kind.value}")
            out.append(And((sensor, Cmp("value", "<", round(rng.uniform(0, 20), 2)))))
    return out


def make_events(n_profiles: int, count: int, rng: random.Random) -> list[dict]:
    rooms = max(1, n_profiles // 20)
    buildings = max(1, n_profiles // 200)
    out = []
    for _ in range(count):
        r = rng.randrange(rooms)
        kind = rng.choice(KINDS)
        out.append(
            {
                "building": f"B{r % buildings}",
                "room": f"R{r}",
                "sensor": f"S{r}-{kind}",
                "kind": kind,
                "value": round(rng.uniform(0, 40), 2),
            }
        )
    return out


def _rss() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        return 0


def measure(n: int, n_events: int, naive_max: int, seed: int, repeat: int = 5) -> dict:
    rng = random.Random(seed)
    profiles = make_profiles(n, rng)
    events = make_events(n, n_events, rng)
    gc.collect()
    rss0 = _rss()
    pool = PrimitivePool()
    t0 = time.perf_counter()
    for i, f in enumerate(profiles):
        pool.add(f, i)
    insert_us = (time.perf_counter() - t0) / n * 1e6
    gc.collect()
    mem = (_rss() - rss0) / n
    gc.freeze()  # a long-lived pool is not garbage; keep the collector from rescanning it

    # `repeat` passes over the events, timed in CPU seconds of this process (the machine is
    # shared: wall time would count the neighbours); the median pass is reported
    passes: list[float] = []
    for _ in range(repeat):
        matches = 0
        t0 = time.process_time()
        for ev in events:
            for entry in pool.match(ev):
                matches += len(entry.owners)
        passes.append(time.process_time() - t0)
    passes.sort()
    pool_s = passes[len(passes) // 2]

    # delete and re-insert a sample: the composite engine does this all the time
    sample = rng.sample(range(n), min(n, 10000))
    t0 = time.perf_counter()
    for i in sample:
        pool.remove(profiles[i], i)
    delete_us = (time.perf_counter() - t0) / len(sample) * 1e6
    t0 = time.perf_counter()
    for i in sample:
        pool.add(profiles[i], i)
    reinsert_us = (time.perf_counter() - t0) / len(sample) * 1e6

    naive_us = None
    if n <= naive_max:
        fns = [compile_filter(f) for f in profiles]
        k = max(20, min(n_events, int(2e7 // n)))
        t0 = time.perf_counter()
        naive_matches = 0
        for ev in events[:k]:
            for fn in fns:
                if fn(ev):
                    naive_matches += 1
        naive_us = (time.perf_counter() - t0) / k * 1e6
        # the two must agree on what they found
        check = sum(len(e.owners) for ev in events[:k] for e in pool.match(ev))
        assert check == naive_matches, (check, naive_matches)
    gc.unfreeze()
    us = pool_s / len(events) * 1e6
    return {
        "profiles": n,
        "distinct_filters": len(pool),
        "events": len(events),
        "matches_per_event": round(matches / len(events), 2),
        "pool_us_per_event": round(us, 2),
        "pool_events_per_s": round(1e6 / us),
        "pool_us_range": f"{passes[0] / len(events) * 1e6:.2f}-{passes[-1] / len(events) * 1e6:.2f}",
        "naive_us_per_event": round(naive_us, 1) if naive_us is not None else "",
        "speedup": round(naive_us / us, 1) if naive_us is not None else "",
        "insert_us": round(insert_us, 2),
        "delete_us": round(delete_us, 2),
        "reinsert_us": round(reinsert_us, 2),
        "bytes_per_profile": round(mem),
    }


def run(
    sizes: list[int], n_events: int, naive_max: int, out: str, seed: int, repeat: int = 5
) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    rows = []
    for n in sizes:
        with console.status(f"pool with {n:,} profiles…"):
            rows.append(measure(n, n_events, naive_max, seed, repeat))
        r = rows[-1]
        console.print(
            f"{n:>9,} profiles: {r['pool_us_per_event']:.2f} µs/event "
            f"({r['pool_events_per_s']:,}/s), naive {r['naive_us_per_event'] or '-'} µs/event"
        )
    cols = {
        "profiles": "profiles",
        "matches_per_event": "matches/ev",
        "pool_us_per_event": "pool µs/ev",
        "pool_us_range": "passes µs/ev",
        "pool_events_per_s": "pool ev/s",
        "naive_us_per_event": "naive µs/ev",
        "speedup": "speed-up",
        "insert_us": "insert µs",
        "delete_us": "delete µs",
        "bytes_per_profile": "B/profile",
    }
    table = Table(title="primitive pool vs naive evaluation (same run)")
    for title in cols.values():
        table.add_column(title, justify="right")
    for r in rows:
        table.add_row(*[f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in cols])
    Console(width=140).print(table)
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    with open(outdir / "pool.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    _plot(rows, outdir / "pool.png")
    console.print(f"wrote {outdir / 'pool.csv'} and {outdir / 'pool.png'}")
    return rows


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["profiles"] for r in rows]
    ax.plot(xs, [r["pool_us_per_event"] for r in rows], "o-", label="Gough-style pool")
    naive = [
        (r["profiles"], r["naive_us_per_event"]) for r in rows if r["naive_us_per_event"] != ""
    ]
    if naive:
        ax.plot(*zip(*naive, strict=True), "s--", label="naive (every profile)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("profiles")
    ax.set_ylabel("µs per event")
    ax.set_title("Primitive pool: filtering cost per event")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
