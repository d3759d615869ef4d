"""Benchmark: one partition key's engine state, state format 2 (plain data) against 1 (pickle).

    python bench/state.py                      # 10^4 profiles over 50 rooms, one room's engine
    python bench/state.py --profiles 1000 --events 500 --repeat 9

What `ens spark stream` stores per key and `ens serve` per checkpoint: the engine of one room
(its keyed profiles of `adapters.spark.generate`, profiles apart) after `--events` readings of
that room. Both formats are written and restored alternately in one run (median of
`--repeat`, CPU time); the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.spark.generate import generate  # noqa: E402
from filters import state  # noqa: E402
from filters.engine import Engine, ProfileRefPickler, load_pickle  # noqa: E402
from profiles.events import Event  # noqa: E402
from profiles.parser import parse_profile  # noqa: E402


def _v1(eng: Engine) -> bytes:
    buf = io.BytesIO()
    ProfileRefPickler(buf, 5).dump(eng)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", type=int, default=10_000)
    ap.add_argument("--rooms", type=int, default=50)
    ap.add_argument(
        "--events", type=int, default=2000, help="readings of the room before the snapshot"
    )
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    recs = list(generate(args.profiles, rooms=args.rooms))
    room = "r1"
    profiles = [
        parse_profile(r["expr"], r["id"], r["subscriber"])
        for r in recs
        if "per room" in r["expr"] or f'"{room}"' in r["expr"]
    ]
    by_id = {p.id: p for p in profiles}
    eng = Engine(profiles)
    rng = random.Random(7)
    kinds = ["co2", "presence", "temperature", "humidity", "window", "ack", "light"]
    for i in range(args.events):
        kind = rng.choice(kinds)
        attrs: dict = {
            "kind": kind,
            "room": room,
            "building": "b1",
            "sensor": f"{kind}-{room}",
            "value": rng.choice([0, 1, 20, 28, 31, 65, 80, 900, 1300, 1600]),
        }
        if kind == "window":
            attrs["state"] = "broken"
        eng.process(Event(f"e{i}", 1_700_000_000 + i * 3.0, attrs))
    eng.take_notifications()
    live = Engine.restore(
        eng.snapshot(profiles_apart=True), by_id
    ).stats()  # without dormant owners

    rows: dict[str, dict[str, list[float]]] = {
        "v1": {"write": [], "read": []},
        "v2": {"write": [], "read": []},
    }
    sizes = {}
    for _ in range(args.repeat):
        for name in ("v1", "v2"):
            t = time.process_time()
            data = _v1(eng) if name == "v1" else eng.snapshot(profiles_apart=True)
            rows[name]["write"].append(time.process_time() - t)
            sizes[name] = len(data)
            t = time.process_time()
            back = load_pickle(data, by_id) if name == "v1" else state.load(data, by_id)
            rows[name]["read"].append(time.process_time() - t)
            assert back.stats() == live
    med = {n: {k: statistics.median(v) * 1000 for k, v in r.items()} for n, r in rows.items()}
    out = {
        "profiles": len(profiles),
        "events": args.events,
        "state": live,
        "v1": {
            "bytes": sizes["v1"],
            "write_ms": round(med["v1"]["write"], 2),
            "restore_ms": round(med["v1"]["read"], 2),
        },
        "v2": {
            "bytes": sizes["v2"],
            "write_ms": round(med["v2"]["write"], 2),
            "restore_ms": round(med["v2"]["read"], 2),
        },
        "restore_speedup_v2_over_v1": round(med["v1"]["read"] / med["v2"]["read"], 2),
        "size_v2_over_v1": round(sizes["v2"] / sizes["v1"], 2),
    }
    print(f"{'format':8} {'bytes':>10} {'write ms':>10} {'restore ms':>11}")
    for n in ("v1", "v2"):
        print(
            f"{n:8} {out[n]['bytes']:>10,} {out[n]['write_ms']:>10.2f} {out[n]['restore_ms']:>11.2f}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
