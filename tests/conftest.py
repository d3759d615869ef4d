"""Shared test fixtures. Everything here runs without ../shared."""

from __future__ import annotations

import _posixsubprocess
import contextlib
import copy
import functools
import gc
import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

# The suite draws the same examples on every run, so CI cannot fail by chance;
# `make fuzz` (HYPOTHESIS_PROFILE=explore) draws new ones to hunt for disagreements.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HERE = Path(__file__).parent
CONFORMANCE = HERE / "conformance"


def load_case(path: Path) -> dict:
    """A case file's data: parsed once per test process (a copy each time: tests may change
    it). `tests/test_conformance.py` reads every case once per engine: the pure-Python YAML
    parser took ~7 % of its CPU."""
    return copy.deepcopy(_parsed_case(path, path.stat().st_mtime_ns))


@functools.cache
def _parsed_case(path: Path, mtime_ns: int) -> dict:
    return yaml.safe_load(path.read_text())


def write_case_files(case: dict, tmp: Path) -> tuple[Path, Path]:
    """A conformance case as the files `ens replay` reads."""
    prof = tmp / "profiles.yaml"
    doc = {"profiles": case["profiles"]}
    if "tz" in case:  # the profile file's tz: (docs/language.md §2.1)
        doc["tz"] = case["tz"]
    prof.write_text(yaml.safe_dump(doc, sort_keys=False))
    evs = tmp / "events.jsonl"
    evs.write_text("".join(json.dumps(e, default=str) + "\n" for e in case["events"]))
    return prof, evs


def canon(notes: list[dict]) -> list[str]:
    """Notifications as a comparable multiset (ts to 1e-6 s)."""
    out = []
    for n in notes:
        key = {k: n[k] for k in ("profile", "events", "partition") if k in n}
        out.append(json.dumps(key, sort_keys=True) + f"@{round(float(n['ts']), 6):.6f}")
    return sorted(out)


def _build_each_cli_once() -> None:
    """typer's CliRunner builds the app's whole click command tree on every invoke (every
    command's annotations evaluated: ~0.3 s for `ens`, more than most commands take to run,
    and hundreds of invokes in the suite). Build each app's tree once, as a process does; an
    app given more commands afterwards is built again."""
    import weakref

    import typer.testing

    build = typer.testing._get_command
    built: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()

    def shape(app: Any) -> int:
        return len(app.registered_commands) + sum(
            1 + shape(g.typer_instance) for g in app.registered_groups
        )

    def get_command(app: Any) -> Any:
        hit = built.get(app)
        if hit is None or hit[0] != shape(app):
            hit = built[app] = (shape(app), build(app))
        return hit[1]

    typer.testing._get_command = get_command  # type: ignore[attr-defined]


_build_each_cli_once()


@pytest.fixture(autouse=True)
def _objects_before_the_test_out_of_gc_scans() -> Iterator[None]:
    """What the worker holds before a test (pytest, hypothesis, every imported module) is
    long-lived: out of the collector's scans while the test runs (`gc.freeze`,
    O(1)), given back afterwards (`gc.unfreeze`, O(1): nothing is kept from collection for
    good). `ens replay`'s own `gc.collect()` before it freezes its engine scanned all of
    them, 0.18 s a replay in-process; so did every full collection a test set off."""
    gc.freeze()
    yield
    gc.unfreeze()


# One redis-server per test process (xdist worker), each test that asks for `redis_url`
# (`rb`, `rt`, `r`) on a database of its own: starting and stopping a server per test took
# ~0.2 s of wall time (little CPU). Tests about the server's life (killed, restarted, persisted, embedded) start their
# own with `tests.helpers_service.redis_server`.
REDIS_DATABASES = 1000
REDIS_FIXTURES = {"_redis_of_this_worker", "redis_url", "rb", "rt", "r"}


@pytest.fixture(scope="session")
def _redis_of_this_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisOfWorker]:
    from tests.helpers_service import redis_server

    with redis_server(tmp_path_factory.mktemp("redis"), databases=REDIS_DATABASES) as url:
        yield RedisOfWorker(url)


class RedisOfWorker:
    """The worker's redis-server and the next database to hand out (0 is never used)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.databases = itertools.cycle(range(1, REDIS_DATABASES))


@pytest.fixture
def redis_url(_redis_of_this_worker: RedisOfWorker) -> Iterator[str]:
    """The URL of an empty Redis database for this test alone (emptied before: a thread a
    failed test left behind may still write into the one it had, a thousand tests ago)."""
    import redis

    url = _redis_of_this_worker.url
    db = next(_redis_of_this_worker.databases)
    with redis.Redis.from_url(url, db=db) as c:
        c.flushdb()
    yield f"{url}?db={db}"
    with redis.Redis.from_url(url, db=db) as c:  # its memory back
        c.flushdb(asynchronous=True)


@pytest.fixture
def rb(redis_url: str) -> Iterator[Any]:
    """A client of the test's database that returns bytes (as the engine worker's)."""
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def rt(redis_url: str) -> Iterator[Any]:
    """A client of the test's database that decodes responses (as the management commands')."""
    import redis

    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def r(rt: Any) -> Any:
    """`rt` under the name the delivery tests give it."""
    return rt


@pytest.fixture
def receiver() -> Iterator[Any]:
    """A webhook receiver on loopback (`tests.helpers_notifiers.Receiver`)."""
    from tests.helpers_notifiers import Receiver

    rec = Receiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (one JVM) for every test that needs one: starting a JVM costs
    ~10 s. Under pytest-xdist the spark tests share one worker (`xdist_group`, below)."""
    from adapters.spark.session import get_spark

    s = get_spark("local[2]")
    yield s
    s.stop()


# `make test-fast` sets ENS_TEST_EXAMPLES=0.2: each property test draws that share of its
# examples (at least 20), the same derandomized ones first; `make test` draws them all.
EXAMPLES_SHARE = float(os.environ.get("ENS_TEST_EXAMPLES", "1"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that takes the `spark` fixture is a spark test, in the xdist group of the one
    session; one that takes a Redis fixture a redis test; property tests draw EXAMPLES_SHARE of their examples. The longest tests first
    (`slow`, then `spark`), so that `--dist loadgroup` does not start them last."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
            _join_group(config, item, "spark")
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)  # so never in `make test-fast` (-m "... not redis")
        if EXAMPLES_SHARE < 1:
            _fewer_examples(getattr(item, "obj", None))
    items.sort(key=lambda i: (not i.get_closest_marker("slow"), not i.get_closest_marker("spark")))


def _join_group(config: pytest.Config, item: pytest.Item, group: str) -> None:
    """Mark ``item`` for ``--dist loadgroup``. pytest-xdist (3.8) groups by appending
    ``@group`` to the worker's node id through ``item._nodeid``, which pytest 9.2's structured
    node ids no longer read (pytest-xdist#1386: the groups were silently ignored, each worker
    started its own JVM): set the id it sends to the scheduler here."""
    item.add_marker(pytest.mark.xdist_group(group))
    node_id = getattr(item, "_id", None)
    if getattr(config.option, "loadgroup", False) and node_id is not None:
        if not isinstance(node_id, str) and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


def _fewer_examples(test: object) -> None:
    # where @settings(...) keeps a test's settings (hypothesis reads the same attribute)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is not None and hasattr(test, "hypothesis"):
        wanted = max(20, int(current.max_examples * EXAMPLES_SHARE))
        if wanted < current.max_examples:
            test._hypothesis_internal_use_settings = settings(current, max_examples=wanted)  # type: ignore[attr-defined]


# `make test-fast` runs the tests marked `fast` (module `pytestmark` or per test): the
# in-process core. A test marked fast may start no process (no redis-server, no JVM, no
# `ens serve`): while it is set up and runs, starting one fails it, in every run, so a new
# test that needs Redis cannot sit silently in the fast set.
_PROCESS_STARTERS = (
    (subprocess, "_fork_exec"),  # subprocess.Popen (and run, check_output, asyncio's)
    (_posixsubprocess, "fork_exec"),  # multiprocessing's spawn
    (os, "fork"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
)


@contextlib.contextmanager
def _no_processes(nodeid: str) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail(
            f"{nodeid} is marked `fast` but starts a process (redis-server, Spark, ens, ...): "
            "take the `fast` mark off it (docs/development.md, the loops)",
            pytrace=True,
        )

    saved = [
        (mod, name, getattr(mod, name)) for mod, name in _PROCESS_STARTERS if hasattr(mod, name)
    ]
    for mod, name, _ in saved:
        setattr(mod, name, refuse)
    try:
        yield
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)


def _in_fast_set(item: pytest.Item) -> bool:
    """What `make test-fast` selects: marked fast (a module's mark included) and not marked
    redis, spark or slow (a test of a fast module may take Redis when it says so)."""
    return item.get_closest_marker("fast") is not None and not any(
        item.get_closest_marker(m) for m in ("redis", "spark", "slow")
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Set-up too: a session fixture (the worker's redis-server) starts in a test's set-up."""
    if not _in_fast_set(item):
        return (yield)
    with _no_processes(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _in_fast_set(item):
        return (yield)
    with _no_processes(item.nodeid):
        return (yield)


@pytest.fixture
def case_files(tmp_path: Path):
    def make(case: dict) -> tuple[Path, Path]:
        return write_case_files(case, tmp_path)

    return make
