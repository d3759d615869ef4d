"""Benchmark: engine checkpoints of large profile sets, profiles inside vs profiles apart.

    python bench/checkpoint.py --n 100000
    python bench/checkpoint.py --index bench/results/spark-index/index   # 10^6 from `ens spark index`

`ens serve` snapshots its engine every 30 s when something changed. With the profiles inside
(`Engine.snapshot()`), every snapshot pickles every profile; with `profiles_apart=True` the
profiles are stored once elsewhere (the service: ``ens:checkpoint:profiles``) and the
snapshot holds the state only. Both are timed on the same engine in the same run, with
nothing in flight (the worst case for the old way: all cost, no state). Figures go to
docs/spark.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from filters.engine import Engine  # noqa: E402
from profiles.parser import parse_profile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="generated profiles (without --index)")
    ap.add_argument(
        "--index", default=None, help="take the profiles from an `ens spark index` snapshot"
    )
    args = ap.parse_args()

    t = time.perf_counter()
    if args.index:
        from adapters.spark.index import load_index

        profiles = load_index(args.index)
    else:
        from adapters.spark.generate import generate

        profiles = [
            parse_profile(r["expr"], r["id"], r.get("subscriber")) for r in generate(args.n)
        ]
    print(f"{len(profiles):,} profiles in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    t = time.perf_counter()
    eng = Engine(profiles)
    build = time.perf_counter() - t
    by_id = {p.id: p for p in profiles}
    res: dict = {"profiles": len(profiles), "engine_build_s": round(build, 2)}
    for name, apart in (("inside", False), ("apart", True)):
        gc.collect()
        t = time.perf_counter()
        snap = eng.snapshot(profiles_apart=apart)
        took = time.perf_counter() - t
        t = time.perf_counter()
        Engine.restore(snap, by_id if apart else None)
        res[name] = {
            "snapshot_s": round(took, 2),
            "snapshot_mb": round(len(snap) / 2**20, 2),
            "restore_s": round(time.perf_counter() - t, 1),
        }
        del snap
    res["snapshot_ratio"] = round(res["inside"]["snapshot_s"] / res["apart"]["snapshot_s"], 1)
    res["size_ratio"] = round(res["inside"]["snapshot_mb"] / res["apart"]["snapshot_mb"], 1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
