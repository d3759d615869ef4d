"""Backtests started from the profile editor: `ens backtest`'s function in a background thread
of the API process, its progress and result in Redis (any API process answers the polls).

The function lives in the `ens` layer (`ens.commands.backtest.console_backtest`), above this
one: `ens serve` hands it over by setting `RUNNER` before the service starts (forked API
processes inherit it). Without it (an app built by hand) or without an archive
(``--archive``), the backtest button says so. Spark is never started from here: a JVM does
not belong in an API process (`ens backtest --spark on` does that).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from fastapi import Request

from notifiers.records import text as as_text
from profiles.errors import ENSError

log = logging.getLogger("ens.service.console")
JOB = "ens:console:backtest:"  # + job id: hash (state, stage, done, total, lines, result, error)
JOB_TTL = 3600  # s a finished job's result is kept
UNAVAILABLE = "backtests need the event archive: start the service with --archive on"

# (profile document, start, end, archive URI, progress) -> the report as `ens backtest --json`
Runner = Callable[[str, float, float, str, "JobProgress"], dict[str, Any]]
RUNNER: Runner | None = None


def available(request: Request) -> bool:
    return RUNNER is not None and bool(request.app.state.settings.archive_uri)


class JobProgress:
    """`ens backtest`'s progress interface (stage, advance, line, warn), written to the job's
    hash at most every 0.2 s per stage."""

    def __init__(self, r: redis.Redis, jid: str) -> None:
        self.r, self.key = r, JOB + jid
        self.lines: list[str] = []
        self.last = 0.0

    def stage(self, what: str, total: int) -> None:
        self.r.hset(self.key, mapping={"stage": what, "total": total, "done": 0})

    def advance(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.2:
            self.last = now
            self.r.hset(self.key, "done", done)

    def line(self, msg: str) -> None:
        self.lines.append(msg)
        self.r.hset(self.key, "lines", json.dumps(self.lines[-20:]))

    warn = line

    def stop(self) -> None:
        pass


def start(r: redis.Redis, document: str, t0: float, t1: float, uri: str) -> str:
    jid = secrets.token_hex(8)
    key = JOB + jid
    r.hset(key, mapping={"state": "running", "stage": "starting", "done": 0, "total": 0,
                         "started": time.time(), "from": t0, "to": t1})  # fmt: skip
    r.expire(key, JOB_TTL)
    threading.Thread(
        target=_run, args=(r, jid, document, t0, t1, uri), name=f"backtest-{jid}", daemon=True
    ).start()
    log.info("console: backtest %s started (%s)", jid, uri)
    return jid


def _run(r: redis.Redis, jid: str, document: str, t0: float, t1: float, uri: str) -> None:
    key = JOB + jid
    assert RUNNER is not None
    try:
        report = RUNNER(document, t0, t1, uri, JobProgress(r, jid))
        r.hset(key, mapping={"state": "done", "result": json.dumps(report)})
        log.info("console: backtest %s done: %s events", jid, report.get("events"))
    except ENSError as exc:
        r.hset(key, mapping={"state": "failed", "error": str(exc)})
    except Exception as exc:  # noqa: BLE001 - the page says it failed; the log has the trace
        log.exception("console: backtest %s failed", jid)
        r.hset(key, mapping={"state": "failed", "error": f"internal error: {exc}"})
    r.expire(key, JOB_TTL)


def status(r: redis.Redis, jid: str) -> dict[str, Any] | None:
    raw = {as_text(k): as_text(v) for k, v in r.hgetall(JOB + jid).items()}
    if not raw:
        return None
    job: dict[str, Any] = {"id": jid, **raw}
    job["lines"] = json.loads(raw.get("lines", "[]"))
    job["result"] = json.loads(raw["result"]) if "result" in raw else None
    total = int(raw.get("total") or 0)
    job["percent"] = min(100, int(100 * int(raw.get("done") or 0) / total)) if total else 0
    return job
