"""Realistic synthetic profile sets for the index benchmark and tests.

A campus of `rooms` rooms in 20 buildings; technicians subscribe mostly to
threshold filters on one room, some to composites per room. Thresholds come
from a few typical values, so many filters repeat across profiles — as they
do when people copy each other's subscriptions — which is what the index's
deduplication is for. `bad` is the share of deliberately broken profiles
(syntax and semantic errors) to exercise the error output.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

KINDS: dict[str, list[float]] = {  # kind -> typical "too high" thresholds
    "temperature": [26, 27.5, 28, 30, 32],
    "humidity": [60, 65, 70, 75],
    "co2": [800, 1000, 1200, 1500],
    "light": [500, 1000, 2000],
}
BAD = [
    'kind = "temperature" and value >',  # syntax: unexpected end
    'seq(a: kind = "co2", b: kind = "presence") select each per room',  # each needs within
    'absent(kind = "temperature") per sensor',  # absent needs within
    'kind = "x" within 10m',  # a bare filter cannot take within
    'seq(a: kind = "co2", b: kind = "presence") within 10m where c.value > 1',  # unknown component
]


def profile_expr(rng: random.Random, rooms: int) -> str:
    room = f"r{rng.randrange(rooms)}"
    building = f"b{rng.randrange(20)}"
    kind = rng.choice(list(KINDS))
    hi = rng.choice(KINDS[kind])
    x = rng.random()
    if x < 0.55:
        return f'kind = "{kind}" and room = "{room}" and value > {hi}'
    if x < 0.65:
        lo, top = sorted(rng.sample([16, 18, 19, 20, 22, 24], 2))
        return f'kind = "temperature" and building = "{building}" and not (value between {lo} and {top})'
    if x < 0.80:
        return (
            f'seq(c: kind = "co2" and room = "{room}" and value > {rng.choice(KINDS["co2"])}, '
            f'p: kind = "presence" and value > 0) within 10m per room'
        )
    if x < 0.88:
        return (
            f'all(t: kind = "temperature" and value > {rng.choice(KINDS["temperature"])}, '
            f'h: kind = "humidity" and value > {rng.choice(KINDS["humidity"])}) within 15m per room'
        )
    if x < 0.94:
        return f'absent(kind = "{kind}" and room = "{room}") within 30m per sensor'
    return (
        f'seq(w: kind = "window" and state = "broken" and building = "{building}", '
        f'not a: kind = "ack", p: kind = "presence") within 30m per room'
    )


def generate(
    n: int, *, rooms: int = 2000, bad: float = 0.0, seed: int = 1
) -> Iterator[dict[str, str]]:
    """`n` profile records {id, expr, subscriber}."""
    rng = random.Random(seed)
    for i in range(n):
        expr = rng.choice(BAD) if bad and rng.random() < bad else profile_expr(rng, rooms)
        yield {"id": f"p{i}", "expr": expr, "subscriber": f"tech{rng.randrange(200)}"}


def write_jsonl(path: str | Path, n: int, **kw: object) -> Path:
    path = Path(path)
    with path.open("w") as fh:
        for rec in generate(n, **kw):  # type: ignore[arg-type]
            fh.write(json.dumps(rec) + "\n")
    return path
