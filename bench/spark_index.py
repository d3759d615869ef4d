"""Benchmark: load an index snapshot of N profiles vs parse the same N profiles.

    python bench/spark_index.py [--n 1000000] [--master local[2]] [--out bench/results/spark_index.json]

Generates N realistic profiles (adapters.spark.generate), builds the snapshot
with `ens spark index` (in-process, Spark session start timed apart), then in
fresh subprocesses: (a) `load_index`, (b) `parse_profile` on every record, one
core, as `ens serve` would at start-up. Each subprocess reports wall time and
peak RSS. Figures go to docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

LOAD = """
import json, resource, sys, time
from adapters.spark.index import load_index
t = time.perf_counter()
ps = load_index(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": time.process_time(), "profiles": len(ps),
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
PARSE = """
import json, resource, sys, time
from profiles.errors import ProfileError
from profiles.parser import parse_profile
t = time.perf_counter()
ps, bad = [], 0
with open(sys.argv[1]) as fh:
    for line in fh:
        r = json.loads(line)
        try:
            ps.append(parse_profile(r["expr"], r["id"], r.get("subscriber")))
        except ProfileError:
            bad += 1
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": time.process_time(), "profiles": len(ps),
                  "errors": bad, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def sub(code: str, arg: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, arg], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default="bench/results/spark-index")
    ap.add_argument("--out", default="bench/results/spark_index.json")
    ap.add_argument(
        "--skip-parse", action="store_true", help="skip the (slow) serial parse baseline"
    )
    args = ap.parse_args()

    from adapters.spark.generate import write_jsonl
    from adapters.spark.index import index_job
    from adapters.spark.session import get_spark

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    src = d / f"profiles-{args.n}.jsonl"
    if not src.exists():
        write_jsonl(src, args.n, bad=0.001)
    res: dict = {
        "n": args.n,
        "master": args.master,
        "source_mb": round(src.stat().st_size / 2**20, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": os.getloadavg(),
    }
    t = time.perf_counter()
    spark = get_spark(args.master)
    res["spark_start_s"] = round(time.perf_counter() - t, 2)
    sys.path.insert(0, str(Path(__file__).parent))
    from spark_replay import tree_cpu

    t, c = time.perf_counter(), tree_cpu()
    m = index_job(spark, str(src), str(d / "index"), errors=str(d / "errors.jsonl"), log=print)
    res["index_s"] = round(time.perf_counter() - t, 2)
    res["index_cpu_s"] = round(tree_cpu() - c, 2)
    res["manifest"] = m["counts"]
    spark.stop()
    res["snapshot_mb"] = round(
        sum(f.stat().st_size for f in (d / "index").rglob("*") if f.is_file()) / 2**20, 1
    )
    res["load"] = [sub(LOAD, str(d / "index")) for _ in range(3)]
    if not args.skip_parse:
        res["parse"] = sub(PARSE, str(src))
    res["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
