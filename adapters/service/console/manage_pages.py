"""Profiles (list, editor, backtest), gateways and deliveries: management only.

The editor takes a profile document as `ens check` does (YAML: ``profiles:``, ``tz:``) and
validates it as the operator types (`profiles.profile_file.parse_profile_document`: the same
errors at the same lines and columns). Saving validates every profile first, then stores each
with `POST /v1/profiles`' own function (`routes.manage.add_profile`): one invalid profile and
nothing is stored. The dead-letter retry is `POST /v1/dead-letters/retry`'s function.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException

import adapters.service.console.backtests as backtests
import adapters.service.console.web as web
from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from adapters.service.console.web import AdminUser, Csrf, R
from adapters.service.routes import admin as admin_api
from adapters.service.routes import manage as manage_api
from notifiers import store
from profiles.errors import ENSError, ProfileError
from profiles.profile_file import parse_profile_document

router = APIRouter()
OUTBOX_SCAN = 20_000  # newest outbox notifications the profile list counts hits in
RATE_WINDOW = 60.0  # s: a gateway's event rate is over this last window
NEW = """profiles:
  - id: window-open-at-night
    expr: |
      seq(w: kind = "window" and state = "open") per building, floor, room
    alarm:
      severity: major
      clear:
        on: kind = "window" and state = "closed"
"""


# ----------------------------------------------------------------------------- profiles


def hits(r: Any) -> dict[str, tuple[int, float]]:
    """Per profile: notifications among the outbox's newest `OUTBOX_SCAN`, and the newest's ts."""
    count: Counter[str] = Counter()
    last: dict[str, float] = {}
    rows: Any = r.xrevrange(store.OUTBOX, count=OUTBOX_SCAN)
    for _eid, fields in rows:
        raw = fields.get(store.OUTBOX_FIELD)
        if raw is None:
            continue
        n = json.loads(raw)
        pid = str(n.get("profile", "")).split("#")[0]
        count[pid] += 1
        last.setdefault(pid, float(n.get("ts", 0)))
    return {pid: (count[pid], last[pid]) for pid in count}


@router.get("/console/profiles", response_class=HTMLResponse)
def profiles_page(request: Request, _u: AdminUser, r: R) -> HTMLResponse:
    stored = rs.list_profiles(r)
    return web.page(request, "profiles.html", profiles=stored, hits=hits(r), scan=OUTBOX_SCAN)


def problems(text: str) -> list[dict[str, Any]]:
    """`ens check`'s errors of a document, each with the document line it is on."""
    _pset, errors = parse_profile_document(text, "editor")
    return [{"line": error_line(e), "message": str(e)} for e in errors]


def error_line(e: ENSError) -> int | None:
    """The line of the document an error is on: ``editor:LINE:COL:`` or its ``file line``."""
    m = re.match(r"editor:(\d+):", str(e))
    if m:
        return int(m.group(1))
    fl = getattr(e, "file_line", None)
    if fl:
        return int(fl)
    m = re.search(r"at line (\d+)", str(e))
    return int(m.group(1)) if m else None


def _document(rec: dict[str, Any]) -> str:
    entry = {k: rec[k] for k in ("id", "expr", "subscriber", "alarm") if rec.get(k) is not None}
    return yaml.safe_dump({"profiles": [entry]}, sort_keys=False, allow_unicode=True, width=100)


def _editor(request: Request, text: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    return web.page(request, "profile_edit.html", status, text=text, problems=problems(text),
                    backtest_on=backtests.available(request), **ctx)  # fmt: skip


@router.get("/console/profiles/edit", response_class=HTMLResponse)
def edit(
    request: Request, _u: AdminUser, r: R, id: Annotated[str | None, Query()] = None
) -> HTMLResponse:
    """The editor: a stored profile (``?id=``) or a new document."""
    if id is None:
        return _editor(request, NEW)
    rec = rs.get_profile(r, id)
    if rec is None:
        raise HTTPException(404, f"no profile {id!r}")
    return _editor(request, _document(rec))


@router.post("/console/profiles/check", response_class=HTMLResponse, dependencies=[Csrf])
def check(request: Request, _u: AdminUser, text: Annotated[str, Form()] = "") -> HTMLResponse:
    """The problems of the editor's text (htmx, as the operator types)."""
    return web.page(request, "_problems.html", problems=problems(text))


@router.post("/console/profiles/save", dependencies=[Csrf])
def save(request: Request, _u: AdminUser, r: R, text: Annotated[str, Form()] = "") -> Response:
    pset, errors = parse_profile_document(text, "editor")
    if pset.subscribers:
        errors.append(ProfileError("editor: subscribers are managed on their own (ens "
                                   "subscriber add, POST /v1/subscribers), not here"))  # fmt: skip
    if not errors and not pset.profiles:
        errors.append(ProfileError("editor: the document defines no profiles"))
    bodies = []
    for p in pset.profiles:  # all checked against the store before any is stored
        alarm = pset.alarms[p.id].to_json() if p.id in pset.alarms else None
        body = manage_api.ProfileIn(id=p.id, expr=p.source, subscriber=p.subscriber, alarm=alarm)
        try:
            profile = rs.validate_profile(r, p.id, p.source, p.subscriber)
            if alarm is not None:
                rs.validate_alarm(profile, alarm)
        except ProfileError as exc:
            errors.append(exc)
        bodies.append(body)
    if errors:
        out = [{"line": error_line(e), "message": str(e)} for e in errors]
        return web.page(request, "profile_edit.html", 422, text=text, problems=out,
                        backtest_on=backtests.available(request))  # fmt: skip
    saved = []
    for body in bodies:
        resp = manage_api.add_profile(body, None, r)
        reply = json.loads(bytes(resp.body))
        saved.append((body.id, resp.status_code, reply))
    return _editor(request, text, saved=saved)


@router.post("/console/profiles/backtest", dependencies=[Csrf])
def start_backtest(
    request: Request,
    _u: AdminUser,
    r: R,
    text: Annotated[str, Form()] = "",
    since: Annotated[str, Form(alias="from")] = "7d",
    until: Annotated[str, Form(alias="to")] = "",
) -> HTMLResponse:
    """Run `ens backtest`'s function over the archive in a background thread; the answer is
    its progress, which polls itself until the result is there."""
    errors: dict[str, str] = {}
    t0 = t1 = 0.0
    try:
        t0 = als.parse_since(since.strip() or "7d") or 0.0
    except ValueError as exc:
        errors["from"] = str(exc)
    try:
        t1 = als.parse_since(until.strip()) if until.strip() else time.time()  # type: ignore[assignment]
    except ValueError as exc:
        errors["to"] = str(exc)
    if not errors and t1 <= t0:
        errors["to"] = "the end is not after the start"
    if not backtests.available(request):
        errors["from"] = backtests.UNAVAILABLE
    if errors:
        return web.page(request, "_backtest.html", 422, job=None, errors=errors)
    uri = request.app.state.settings.archive_uri
    jid = backtests.start(r, text, t0, t1, uri)
    return web.page(request, "_backtest.html", job=backtests.status(r, jid), errors={})


@router.get("/console/backtests/{jid}", response_class=HTMLResponse)
def backtest_status(request: Request, jid: str, _u: AdminUser, r: R) -> HTMLResponse:
    job = backtests.status(r, jid)
    if job is None:
        raise HTTPException(404, f"no backtest {jid!r}")
    return web.page(request, "_backtest.html", job=job, errors={})


# ----------------------------------------------------------------------------- gateways


def gateway_rows(r: Any, now: float) -> list[dict[str, Any]]:
    """Each gateway with what the service keeps of its traffic: the ids of its recent events
    (the ingest dedup set: last seen, rate), its late events and its clock skew (the engine
    worker's heartbeat)."""
    status = rs.worker_status(r) or {"stats": {}}
    late = status["stats"].get("late_by_gateway", {})
    skewed = set(status["stats"].get("skewed_gateways", []))
    out = []
    for g in rs.list_gateways(r):
        key = rs.seen_key(g["name"])
        newest: Any = r.zrevrange(key, 0, 0, withscores=True)
        recent = int(r.zcount(key, (now - RATE_WINDOW) * 1000, "+inf"))  # type: ignore[arg-type]
        out.append({
            **g,
            "last_seen": newest[0][1] / 1000 if newest else None,
            "rate": recent / RATE_WINDOW,
            "late": int(late.get(g["name"], 0)),
            "skewed": g["name"] in skewed,
        })  # fmt: skip
    return out


@router.get("/console/gateways", response_class=HTMLResponse)
def gateways_page(request: Request, _u: AdminUser, r: R) -> HTMLResponse:
    now = time.time()
    return web.page(request, "gateways.html", gateways=gateway_rows(r, now), window=RATE_WINDOW)


# ----------------------------------------------------------------------------- deliveries


def retries(r: Any, limit: int = 100) -> list[dict[str, Any]]:
    """Deliveries waiting for their next attempt, soonest first."""
    due: Any = r.zrange(store.RETRY, 0, limit - 1, withscores=True)
    out = []
    for key, at in due:
        raw = r.hget(store.STATE, key)
        st = json.loads(raw) if raw else {}
        n = st.get("n", {})
        out.append({"key": key, "due": at, "attempts": st.get("attempts", 0),
                    "profile": n.get("profile"), "id": n.get("id")})  # fmt: skip
    return out


def _deliveries(request: Request, r: Any, notice: str = "", status: int = 200) -> HTMLResponse:
    backlog, age, dead = store.delivery_backlog(r)
    return web.page(
        request, "deliveries.html", status, notice=notice, backlog=backlog, age=age,
        dead_count=dead, outbox=admin_api.read_outbox(None, r, None, 50)[::-1],
        retries=retries(r), dead=admin_api.list_dead_letters(None, r, 100),
    )  # fmt: skip


@router.get("/console/deliveries", response_class=HTMLResponse)
def deliveries_page(request: Request, _u: AdminUser, r: R) -> HTMLResponse:
    return _deliveries(request, r)


@router.post("/console/dead-letters/retry", dependencies=[Csrf])
def retry(request: Request, _u: AdminUser, r: R, id: Annotated[str, Form()] = "") -> HTMLResponse:
    """Retry one dead letter (or all with ``id=all``)."""
    body = admin_api.RetryIn(all=True) if id == "all" else admin_api.RetryIn(ids=[id])
    try:
        out = admin_api.retry_dead_letters(body, None, r)
    except HTTPException as exc:
        return _deliveries(request, r, str(exc.detail), exc.status_code)
    return _deliveries(request, r, f"{out.scheduled} dead letter(s) scheduled for retry")
