"""Waiting on a Redis stream for at most a given time, without Redis' timer tick.

A blocked XREADGROUP returns as soon as an entry arrives, but its *timeout* fires on the
server's timer tick (every 1000/hz ms: 100 ms at Redis' default hz 10), not at the moment asked
for (measured: BLOCK 5, 20, 50 and 70 all return after ~100.8 ms). A worker that waits until a
deadline — a held event falling due, a retry, a send in flight — would act up to a tick late.
`read_by` blocks only while a whole tick fits before the deadline and polls the rest. Both
workers (the engine's and the deliverer's) wait through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

BLOCK_TICK = 0.1  # seconds: Redis' timer tick at its default hz 10 (a longer tick only costs polls)
POLL_NAP = 0.005  # seconds between two reads that do not block


def read_by(
    read: Callable[[int | None], Any],
    wait: float,
    nap: Callable[[float], object] = time.sleep,
) -> Any:
    """`read(block_ms)` (None: do not block), returning within about `wait` seconds.

    With a tick or more to spare it blocks until a tick before the deadline (the read's timeout
    then fires before it); closer, it reads without blocking and, if nothing came, naps at most
    `POLL_NAP` (`nap` may wake earlier, e.g. on a finished send). What the read returned is
    returned; an empty answer means "wait again": the caller's loop asks with what is left.
    """
    if wait >= 2 * BLOCK_TICK:
        return read(int((wait - BLOCK_TICK) * 1000))
    got = read(None)
    if not got and wait > 0:
        nap(min(wait, POLL_NAP))
    return got
