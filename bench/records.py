"""What the typed records cost on the per-event paths (not a test).

Interleaves, in one run, the record layer (`adapters.service.records`, `notifiers.records`)
with the inline code it replaced, on what the engine worker does per event and per commit:
decode an ingest entry of ``--batch`` normalized events, append a journal operation per
event, encode the journal entry, encode an outbox record. Prints CPU ns per event (median of ``--repeat`` passes) and the ratio.

    python bench/records.py --batch 100 --repeat 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.service.records import OP_EVENT, JournalEntry, decode_ingest  # noqa: E402
from notifiers.records import OutboxRecord, dumps  # noqa: E402


def _field(fields: Any, name: str) -> Any:
    v = fields.get(name)
    return fields.get(name.encode()) if v is None else v


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _inline_decode(entry_id: str, fields: Any) -> list[tuple[str, str, Any]]:
    """redis_store.decode_entry before records.py (its batch branch), as it was."""
    gw = _text(_field(fields, "g") or "?")
    batch = _field(fields, "b")
    fmt = _field(fields, "v")
    plain = fmt is not None and _text(fmt) == "n"
    events = orjson.loads(batch) if plain else json.loads(batch)
    if not isinstance(events, list):
        raise ValueError("field 'b' must be a JSON array")
    return [(f"{entry_id}.{i}", gw, ev) for i, ev in enumerate(events)]


def _inline_enqueue_fields(record: dict[str, Any]) -> dict[str, str]:
    """store.enqueue's checks and fields before records.py, as they were."""
    nid = record.get("id")
    if not isinstance(nid, str) or not nid:
        raise ValueError("a notification needs a non-empty string 'id'")
    if not isinstance(record.get("profile"), str):
        raise ValueError("a notification needs a string 'profile'")
    if not isinstance(record.get("ts"), (int, float)) or isinstance(record.get("ts"), bool):
        raise ValueError("a notification needs a numeric 'ts' (epoch seconds)")
    if not isinstance(record.get("events"), Mapping):
        raise ValueError("a notification needs an 'events' object")
    sub = record.get("subscriber")
    if sub is not None and not isinstance(sub, str):
        raise ValueError("'subscriber' must be a string or null")
    return {"n": dumps(dict(record))}


def _old(fields: dict[bytes, bytes], note: dict[str, Any]) -> int:
    inputs: list[list[Any]] = []
    evs = _inline_decode("1700000000000-0", fields)
    for key, _gw, _obj in evs:
        inputs.append(["e", key])
    {"ops": dumps(inputs), "n": 1, "ctl": "0-0"}  # noqa: B018 - the encoding is the cost
    _inline_enqueue_fields(note)
    return len(evs)


def _new(fields: dict[bytes, bytes], note: dict[str, Any]) -> int:
    inputs: list[list[Any]] = []
    evs = decode_ingest("1700000000000-0", fields)
    for key, _gw, _obj in evs:
        inputs.append([OP_EVENT, key])  # as the worker writes it (records.op_event, inline)
    JournalEntry(inputs, 1, "0-0").fields()
    OutboxRecord(note).fields()
    return len(evs)


def _time(
    fn: Callable[..., int], fields: dict[bytes, bytes], note: dict[str, Any], rounds: int
) -> float:
    t = time.process_time()  # CPU time of this process: less of the machine's load in it
    n = 0
    for _ in range(rounds):
        n += fn(fields, note)
    return (time.process_time() - t) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=100, help="events per ingest entry")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    evs = [
        {
            "id": f"e{i}",
            "ts": 1700000000.0 + i,
            "kind": "temp",
            "room": f"r{i % 9}",
            "value": 20 + i % 7,
        }
        for i in range(max(args.batch, 2))
    ][: args.batch]
    fields = {b"b": orjson.dumps(evs), b"g": b"gw", b"v": b"n", b"ver": b"1"}
    note = {
        "id": "p:e:1",
        "profile": "p",
        "ts": 1.0,
        "subscriber": "s",
        "events": {"a": evs[0], "b": evs[-1]},
    }
    old, new = [], []
    for _ in range(args.repeat):  # interleaved: the machine's noise hits both alike
        old.append(_time(_old, fields, note, args.rounds))
        new.append(_time(_new, fields, note, args.rounds))
    o, n = statistics.median(old), statistics.median(new)
    print(
        f"per event (batch {args.batch}): inline {o:.0f} ns, records {n:.0f} ns, ratio {n / o:.3f}"
    )


if __name__ == "__main__":
    main()
