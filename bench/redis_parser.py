"""hiredis vs redis-py's pure-Python RESP parser on what the engine worker reads (not a test).

XADDs ``--entries`` ingest entries of ``--batch`` normalized events each (the API's format) to
an embedded Redis, then times XRANGE over all of them with each parser (median of
``--repeat`` passes) and prints the ratio.

    python bench/redis_parser.py --entries 200 --batch 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis
from redis._parsers import _HiredisParser, _RESP2Parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.service import redis_store as rs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--single", type=int, default=20_000, help="one-event entries")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        conn = rs.connect(None, d)
        url = conn.url
        w = redis.Redis.from_url(url)
        ev = {"id": "e1", "ts": 1795300000.123, "kind": "temperature", "room": "r1", "value": 21.5}
        body = json.dumps([ev] * args.batch)
        with w.pipeline(transaction=False) as p:
            for _ in range(args.entries):
                p.xadd("batches", {"b": body, "g": "gw", "v": "n"})
            for _ in range(args.single):
                p.xadd("singles", {"b": json.dumps([ev]), "g": "gw", "v": "n"})
            p.execute()
        print(f"{args.entries} entries of {args.batch} events; {args.single} one-event entries")
        print(f"{'parser':<10}{'batches ms':>12}{'singles ms':>12}")
        res = {}
        for name, cls in (("python", _RESP2Parser), ("hiredis", _HiredisParser)):
            c = redis.Redis.from_url(url, parser_class=cls)
            times = {}
            for stream in ("batches", "singles"):
                passes = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    c.xrange(stream)
                    passes.append(time.perf_counter() - t0)
                times[stream] = statistics.median(passes)
            res[name] = times
            print(f"{name:<10}{1000 * times['batches']:>12.1f}{1000 * times['singles']:>12.1f}")
            c.close()
        print(
            f"hiredis speed-up: batches {res['python']['batches'] / res['hiredis']['batches']:.2f}x, "
            f"one-event entries {res['python']['singles'] / res['hiredis']['singles']:.2f}x"
        )
        w.close()
        conn.close()


if __name__ == "__main__":
    main()
