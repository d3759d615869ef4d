"""Writes the golden snapshots of tests/golden: `python tests/golden/make_golden.py tests/golden vN`.

Run it with the release whose state format version N the files hold (v1: ENS 0.1, the pickle);
every later release must restore them (tests/test_state.py). Never rewrite an existing file.
"""

import json
import sys
from pathlib import Path

from filters.engine import Engine
from profiles.events import event_from_obj
from profiles.profile_file import parse_profile_document

out, tag = Path(sys.argv[1]), sys.argv[2]
doc = {
    "profiles": [
        {
            "id": "break-in",
            "expr": 'seq(w: kind = "window" and state = "broken", p: kind = "presence") within 30m per room',
        },
        {
            "id": "hot-then-cold",
            "expr": 'seq(h: kind = "t" and value > 30, not o: kind = "door", c: kind = "t" and value < 18) within 1h per room select last',
        },
        {
            "id": "pairs",
            "expr": 'all(a: kind = "co2" and value > 1000, b: kind = "presence") within 10m per room select each consume shared',
        },
        {"id": "silent", "expr": 'absent(kind = "heartbeat") within 15m per sensor'},
        {
            "id": "door-open",
            "expr": 'seq(d: kind = "door" and state = "open", not c: kind = "door" and state = "closed") within 5m per room',
        },
        {"id": "hot", "expr": 'kind = "t" and value > 35'},
        {"id": "night", "expr": 'seq(n: clock("22:00"), p: kind = "presence") within 8h'},
    ]
}
pset, errs = parse_profile_document(json.dumps(doc), "golden.json")
assert not errs, errs
profiles = pset.profiles
evs = []
t0 = 1764000000.0
kinds = [
    ("window", {"state": "broken"}),
    ("presence", {}),
    ("t", {"value": 31}),
    ("door", {"state": "open"}),
    ("t", {"value": 12}),
    ("co2", {"value": 1200}),
    ("heartbeat", {}),
    ("t", {"value": 36}),
    ("door", {"state": "closed"}),
]
i = 0
for step in range(120):
    k, a = kinds[(step * 7) % len(kinds)]
    room = f"r{step % 3}"
    evs.append(
        {
            "id": f"e{step}",
            "ts": t0 + step * 170,
            "kind": k,
            "room": room,
            "sensor": f"s-{room}",
            **a,
        }
    )
(out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
(out / "profiles.json").write_text(json.dumps(doc, indent=1) + "\n")
for plan in ("eager", "rare-first"):
    eng = Engine(profiles, plan=plan)
    whole = Engine(profiles, plan=plan)
    half = len(evs) // 2
    for n, e in enumerate(evs):
        ev = event_from_obj(e, f"#{n + 1}")
        whole.process(ev)
        if n < half:
            eng.process(event_from_obj(e, f"#{n + 1}"))
    whole.finish()
    expect = [n.to_json() for n in whole.take_notifications()]
    (out / f"expect-{plan}.json").write_text(json.dumps(expect, indent=0) + "\n")
    (out / f"{tag}-{plan}-inline.bin").write_bytes(eng.snapshot())
    (out / f"{tag}-{plan}-apart.bin").write_bytes(eng.snapshot(profiles_apart=True))
    print(plan, len(expect), "notifications;", eng.stats() if hasattr(eng, "stats") else "")
