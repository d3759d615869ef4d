"""Rates for evaluation plans (issue 16): `--stats STATS.json` files, or counted from events.

The planner itself is pure (`filters/plans/choose.py`); this reads the `ens spark stats`
document, checks it and turns problems into user errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filters.plans.choose import MODES, Rates
from profiles.ast import Profile
from profiles.errors import ENSError
from profiles.events import Event


def check_plan(plan: str) -> str:
    """The --plan option: eager, rare-first or auto."""
    if plan not in MODES:
        raise ENSError(f"--plan: unknown plan {plan!r} (one of {', '.join(MODES)})")
    return plan


def load_stats(path: str | Path | None) -> Rates | None:
    """An `ens spark stats` document (version 1) as rates, or None without --stats."""
    if path is None:
        return None
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ENSError(f"--stats: no such file: {path}") from None
    except IsADirectoryError:
        raise ENSError(f"--stats: {path} is a directory, not an `ens spark stats` file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ENSError(
            f"--stats: cannot read {path}: {getattr(e, 'strerror', None) or e}"
        ) from None
    except json.JSONDecodeError as e:
        raise ENSError(
            f"--stats: {path}, line {e.lineno}, column {e.colno}: not JSON ({e.msg})"
        ) from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ENSError(f"--stats: {path} is not an `ens spark stats` document (version 1)")
    for part in ("profiles", "filters"):
        if not isinstance(doc.get(part, {}), dict):
            raise ENSError(f"--stats: {path}: '{part}' must be an object")
    try:
        return Rates(doc)
    except (AttributeError, TypeError):
        raise ENSError(
            f"--stats: {path}: every component entry must be an object with rate_per_hour"
        ) from None


def count_stats(
    profiles: list[Profile], events: Iterable[Event], source: str = ""
) -> dict[str, Any]:
    """The `ens spark stats` document computed locally (tests, benchmarks; no Spark needed)."""
    from adapters.spark.plan import leaves
    from adapters.spark.stats import VERSION, Counter, distinct_filters, rates_of
    from filters.canon import filter_key

    filters, pos = distinct_filters(profiles)
    c = Counter(filters)
    n = 0
    first = last = None
    for ev in events:
        c.add(ev.attrs)
        n += 1
        first = ev.ts if first is None else min(first, ev.ts)
        last = ev.ts if last is None else max(last, ev.ts)
    hours = (last - first) / 3600.0 if first is not None and last is not None else None
    doc: dict[str, Any] = {
        "version": VERSION,
        "source": source,
        "events": n,
        "first_ts": first,
        "last_ts": last,
        "hours": round(hours, 6) if hours is not None else None,
        "filters": {k: rates_of(c.counts[i], n, hours) for k, i in pos.items()},
        "profiles": {},
    }
    for p in profiles:
        doc["profiles"][p.id] = {
            lf.name: {
                "filter": filter_key(lf.filter),
                "negated": lf.negated,
                **rates_of(c.counts[pos[filter_key(lf.filter)]], n, hours),
            }
            for lf in leaves(p)
        }
    return doc
