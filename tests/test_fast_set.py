"""`make test-fast` runs the in-process core only (docs/development.md, the loops): a test marked
`fast` that starts a process fails, and one that takes a Redis fixture is never selected."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REDIS_FIXTURES

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run(["true"], check=True),  # redis-server, ens serve, the JVM
        lambda: os.system("true"),
    ],
    ids=["subprocess", "os.system"],
)
def test_a_fast_test_cannot_start_a_process(start: object) -> None:
    with pytest.raises(pytest.fail.Exception, match="marked `fast` but starts a process"):
        start()  # type: ignore[operator]


def test_a_test_that_takes_redis_is_marked_redis(request: pytest.FixtureRequest) -> None:
    """`make test-fast` deselects `redis`: a fast module's test that asks for a database is
    left to `make test`, never run with the fast set (nor failed by the guard above)."""
    items = request.session.items
    with_redis = [i for i in items if REDIS_FIXTURES & set(getattr(i, "fixturenames", ()))]
    assert all(i.get_closest_marker("redis") for i in with_redis)
