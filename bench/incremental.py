"""Benchmark: incremental engine checkpoints (by partition) against whole-engine snapshots.

    python bench/incremental.py                       # 10^5 partitions, 1,000 events per step
    python bench/incremental.py --partitions 100000 --step 1000 --repeat 3

What `ens serve` writes per snapshot and reads at recovery (issue 38.2), measured on the
engine alone (no Redis): an engine holding `--partitions` partitions (a keyed `seq` profile,
one partial match per room, a keyed `absent` profile, a plain filter), then steps of `--step`
events on random rooms. Before: each snapshot is `Engine.snapshot(profiles_apart=True)` and
recovery `Engine.restore`; after: each snapshot is the header and the records of the
partitions the step changed (`filters.partitions.PartitionedEngine.changed`), and recovery
builds the engine from the profiles and loads the header and every record. CPU time, median of
`--repeat`; the figures go to docs/state.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from filters.engine import Engine  # noqa: E402
from filters.partitions import PartitionedEngine, encode_id  # noqa: E402
from profiles.events import Event  # noqa: E402
from profiles.parser import parse_profile  # noqa: E402

PROFILES = [
    ('seq(w: kind = "window", p: kind = "presence") within 1h per room', "break-in"),
    ('absent(kind = "heartbeat") within 2h per room', "silent"),
    ('kind = "t" and value > 35', "hot"),
]


def _cpu(fn):  # type: ignore[no-untyped-def]
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=100_000, help="rooms (2 partitions each)")
    ap.add_argument("--step", type=int, default=1000, help="events between two snapshots")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    profiles = [parse_profile(text, pid) for text, pid in PROFILES]
    rooms = max(1, args.partitions // 2)
    pe = PartitionedEngine(Engine(profiles))
    t0 = 1_764_000_000.0
    for i in range(rooms):  # one open match and one silence timer per room
        pe.process(Event(f"w{i}", t0 + i * 0.01, {"kind": "window", "room": i}))
        pe.process(Event(f"h{i}", t0 + i * 0.01, {"kind": "heartbeat", "room": i}))
    pe.changed()
    now = t0 + rooms * 0.01
    eng = pe.engine
    parts = len(eng.part_ids())
    whole_w, inc_w, whole_b, inc_b, dirty = [], [], [], [], []
    for _ in range(args.repeat):
        for j in range(args.step):
            now += 0.01
            room = rng.randrange(rooms)
            kind = rng.choice(["heartbeat", "t", "window"])
            pe.process(Event(f"s{j}", now, {"kind": kind, "room": room, "value": 30}))
        eng.take_notifications()
        tw, snap = _cpu(lambda: eng.snapshot(profiles_apart=True))
        ti, recs = _cpu(lambda: (pe.changed(), pe.header()))
        changed, header = recs
        whole_w.append(tw)
        inc_w.append(ti)
        whole_b.append(len(snap))
        inc_b.append(len(header) + sum(len(r.data) for r in changed.values() if r is not None))
        dirty.append(len(changed))
    # recovery: everything stored, read back
    every = eng.store_parts(eng.part_ids())
    records = {encode_id(p): got[0] for p, got in every.items() if got is not None}
    header = pe.header()
    snap = eng.snapshot(profiles_apart=True)
    by_id = {p.id: p for p in profiles}
    whole_r, inc_r = [], []
    for _ in range(args.repeat):
        tr, back = _cpu(lambda: Engine.restore(snap, by_id))
        whole_r.append(tr)

        def load() -> Engine:
            new = PartitionedEngine(
                Engine([by_id[i] for i in PartitionedEngine.profile_order(header)])
            )
            new.begin(header)
            new.load_all((p, got[0]) for p, got in every.items() if got is not None)
            return new.engine

        ti2, back2 = _cpu(load)
        inc_r.append(ti2)
        assert back.stats() == back2.stats(), (back.stats(), back2.stats())
    med = statistics.median
    out = {
        "partitions": parts,
        "events_per_snapshot": args.step,
        "partitions_written_per_snapshot": med(dirty),
        "whole_snapshot_bytes": med(whole_b),
        "incremental_snapshot_bytes": med(inc_b),
        "whole_snapshot_cpu_s": round(med(whole_w), 4),
        "incremental_snapshot_cpu_s": round(med(inc_w), 4),
        "stored_bytes_whole": len(snap),
        "stored_bytes_records": len(header) + sum(map(len, records.values())),
        "recovery_whole_cpu_s": round(med(whole_r), 3),
        "recovery_records_cpu_s": round(med(inc_r), 3),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
