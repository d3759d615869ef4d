"""Issue 41's flood in-process (not a test): `select each consume shared` on a kind seen at
every event, a day's window, then one closing event.

    python bench/each_flood.py                 # the caps' defaults (filters/caps.py)
    python bench/each_flood.py --no-caps       # as before the caps (no limit)

Prints the cost per opening event (and the worst one), the closing event's time and
notifications, the time of an unrelated filter's event right after, the live partial
matches, the peak RSS and what the caps dropped.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from filters.caps import Caps  # noqa: E402
from filters.engine import Engine  # noqa: E402
from profiles.events import Event  # noqa: E402
from profiles.parser import parse_profile  # noqa: E402

FLOOD = 'seq(a: kind = "x", b: kind = "y") within 1d select each consume shared'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=52_920, help="x events (issue 41: 52,920)")
    ap.add_argument("--no-caps", action="store_true", help="no limits (as before the caps)")
    args = ap.parse_args()
    big = 10**12
    caps = Caps(big, big, big) if args.no_caps else Caps()
    eng = Engine([parse_profile(FLOOD, "flood"), parse_profile('kind = "z"', "other")], caps=caps)
    n = args.events
    worst = 0.0
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        eng.process(Event(f"x{i}", float(i), {"kind": "x"}))
        worst = max(worst, time.perf_counter() - t)
    per_x = (time.perf_counter() - t0) / n
    t = time.perf_counter()
    eng.process(Event("y", float(n), {"kind": "y"}))
    closing = time.perf_counter() - t
    notes = len(eng.take_notifications())
    t = time.perf_counter()
    eng.process(Event("z", float(n), {"kind": "z"}))
    other = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(
        f"{n} x events: {per_x * 1e6:.1f} µs each (worst {worst * 1000:.1f} ms); the y: "
        f"{closing * 1000:.0f} ms, {notes} notifications; an unrelated filter's event: "
        f"{other * 1e6:.0f} µs; live partial matches {eng.stats()['partial_matches']}; "
        f"peak RSS {rss} MB; caps took {eng.take_cap_hits()}"
    )


if __name__ == "__main__":
    main()
