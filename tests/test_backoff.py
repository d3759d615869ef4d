"""One retry rule (`notifiers.backoff`) for the delivery worker and `ens post`: full-jitter
exponential backoff, a Retry-After the least wait (issue 39 item 4)."""

from __future__ import annotations

import random

import pytest

from notifiers.backoff import retry_delay
from notifiers.config import RetryPolicy

pytestmark = pytest.mark.fast


def test_jitter_below_the_doubling_ceiling_and_retry_after_the_least_wait() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
        assert 0 <= retry_delay(attempt, None, 0.5, 30.0, rng=rng) <= ceiling
        assert retry_delay(attempt, 1.0, 0.5, 30.0, rng=rng) >= 1.0
    assert retry_delay(1, 4200, 1, 10, max_retry_after=60) == 60  # a receiver cannot stall us
    assert retry_delay(1, -5, 0.001, 0.001) <= 0.001  # a date in the past: no wait of its own


def test_the_worker_and_ens_post_apply_the_same_rule() -> None:
    from ens.commands.service import retry_delay as post_delay

    policy = RetryPolicy(base=0.5, cap=30.0)
    for attempt, after in [(1, None), (3, None), (2, 1.0), (6, 2.0)]:
        a, b, c = (random.Random(attempt) for _ in range(3))
        expected = retry_delay(attempt, after, 0.5, 30.0, policy.max_retry_after, a)
        assert policy.delay(attempt, after, b) == expected == post_delay(attempt, after, c)
