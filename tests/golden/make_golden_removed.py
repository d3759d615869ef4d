"""Writes the golden snapshots of removed profiles: `python tests/golden/make_golden_removed.py tests/golden`.

Run with ENS at commit 061e918 (issue 41.1, before the fix): its snapshots kept the no-op
terminators of a removed profile's finished partial matches, so they refer to that profile.
`v2-removed-apart.bin`: profile `w` removed after its match completed (restore it without `w`);
`v2-readded-apart.bin`: `w` removed, then added again with another expression (and a partial
match of its own), restored with the new `w`. Both also hold `k`, a composite with a partial
match, and `f`, a filter. Never rewrite an existing file.
"""

import sys
from pathlib import Path

from filters.engine import Engine
from profiles.events import Event
from profiles.parser import parse_profile

out = Path(sys.argv[1])
W = 'seq(a: kind = "A", b: kind = "C") within 10s per room'
W2 = 'seq(a: kind = "A", d: kind = "D", e: kind = "E") within 10s per room'
K = 'seq(x: kind = "X", y: kind = "Y") within 1h per room'
F = 'kind = "F"'


def engine() -> Engine:
    eng = Engine([parse_profile(W, "w"), parse_profile(K, "k"), parse_profile(F, "f")])
    eng.process(Event("x1", 0.0, {"kind": "X", "room": 1}))
    eng.process(Event("a1", 1.0, {"kind": "A", "room": 1}))
    eng.process(Event("c1", 2.0, {"kind": "C", "room": 1}))
    eng.take_notifications()
    eng.remove_profile("w")
    return eng


(out / "v2-removed-apart.bin").write_bytes(engine().snapshot(profiles_apart=True))
eng = engine()
eng.add_profile(parse_profile(W2, "w"))
eng.process(Event("a2", 3.0, {"kind": "A", "room": 1}))
(out / "v2-readded-apart.bin").write_bytes(eng.snapshot(profiles_apart=True))
