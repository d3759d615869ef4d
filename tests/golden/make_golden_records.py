"""Writes the golden partition records of tests/golden: `python tests/golden/make_golden_records.py tests/golden vN`.

The engine of make_golden.py's stream stopped halfway (notifications not taken: the header
holds them), stored as partition records and a header (`filters.partitions`), one JSON file per
plan: ``{"header": base64, "partitions": {encode_id(part): base64}}``. Every later release must
load them and end the stream with `expect-<plan>.json` (tests/test_partitions.py). Run it with
the release whose record format version N the records hold; never rewrite an existing file.
From v3 the engine is a shared one (`PartitionedEngine(shared=True)`, as Spark's workers
keep it): its header names the profile order by a digest.
"""

import base64
import json
import sys
from pathlib import Path

from filters.engine import Engine
from filters.partitions import PartitionedEngine, encode_id
from profiles.events import event_from_obj
from profiles.profile_file import parse_profile_document

out, tag = Path(sys.argv[1]), sys.argv[2]
pset, errs = parse_profile_document((out / "profiles.json").read_text(), "profiles.json")
assert not errs, errs
lines = (out / "events.jsonl").read_text().splitlines()
evs = [event_from_obj(json.loads(line), f"#{n}") for n, line in enumerate(lines, 1)]
for plan in ("eager", "rare-first"):
    pe = PartitionedEngine(Engine(pset.profiles, plan=plan), shared=tag >= "v3")
    for ev in evs[: len(evs) // 2]:
        pe.process(ev)
    parts = pe.changed()
    doc = {
        "header": base64.b64encode(pe.header()).decode(),
        "partitions": {
            encode_id(p): base64.b64encode(rec.data).decode()
            for p, rec in parts.items()
            if rec is not None
        },
    }
    (out / f"{tag}-records-{plan}.json").write_text(
        json.dumps(doc, indent=0, sort_keys=True) + "\n"
    )
    print(plan, len(doc["partitions"]), "partitions")
