"""Feeding one released event to an engine: the rule of the service's worker
(`adapters.service.intake`) and of `ens spark stream`'s engines (`adapters.spark.live`).

An event older than the engine's time is late (`is_late`): it can no longer be fed in ``ts``
order; both log it the same way (`log_late`). An event the engine raises on (a poison event)
is logged and skipped (`feed`): one bad event must not stop detection for every other one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from profiles.events import Event


def is_late(now: float | None, ts: float) -> bool:
    """Whether an event stamped `ts` is behind an engine at time `now` (None: no time yet)."""
    return now is not None and ts < now


def log_late(log: logging.Logger, now: float, ev: Event, gw: str, what: str) -> None:
    """The WARNING line of a late event: how far behind, and what was done with it."""
    log.warning(
        "late event %s from gateway %s: ts %.3f is %.3f s behind engine time; %s",
        ev.id,
        gw,
        ev.ts,
        now - ev.ts,
        what,
    )


def feed(process: Callable[[Event], object], ev: Event, gw: str, log: logging.Logger) -> bool:
    """`process` the event; False when the engine raised on it (logged with its traceback,
    the event skipped)."""
    try:
        process(ev)
    except Exception:  # a poison event must not stop the engine
        log.exception("engine failed on event %s from gateway %s; skipped", ev.id, gw)
        return False
    return True
