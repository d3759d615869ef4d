"""The wait before a retry: one rule for the delivery worker (webhooks, mail) and for `ens post`
(`adapters.service.client`).

Exponential backoff with full jitter (a uniform draw below ``base * 2**(attempt - 1)``, at most
``cap``), so that clients failing together do not come back together; a ``Retry-After`` the
server gave is the least wait (at most ``max_retry_after``): never sooner than asked, and a
`Retry-After: 1` repeated through an outage does not pin every retry to 1 s.
"""

from __future__ import annotations

import math
import random


def retry_delay(
    attempt: int,
    retry_after: float | None,
    base: float,
    cap: float,
    max_retry_after: float = math.inf,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...)."""
    jitter = (rng or random).uniform(0, min(cap, base * 2 ** max(attempt - 1, 0)))
    if retry_after is None:
        return jitter
    return max(jitter, min(max(retry_after, 0.0), max_retry_after))
