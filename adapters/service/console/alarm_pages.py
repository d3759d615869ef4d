"""The open alarms (grouped by building > floor > room), an alarm's detail, acknowledge and
clear. The actions call the HTTP API's own route functions (`routes.alarms`), so the console
follows the same rules and gets the same answers (404, 409, 503) as `POST /v1/alarms/...`."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response

import adapters.service.console.evidence as evidence
import adapters.service.console.web as web
from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from adapters.service.console.web import Csrf, R, User
from adapters.service.routes import alarms as api
from notifiers.alarms import SilenceError
from profiles.alarm import SEVERITIES

router = APIRouter()
PER_PAGE = 100
NONE = "—"  # the group of alarms without that label
LOCATION = ("building", "floor", "room")
OPEN = "open"  # every state but cleared-acknowledged (the default view)


@dataclass
class Group:
    """One building > floor > room heading and its alarms (of the current page)."""

    path: tuple[str, str, str]
    alarms: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AlarmPage:
    groups: list[Group]
    total: int
    page: int
    pages: int
    counts: dict[str, int]  # by severity, of all filtered alarms


def _place(a: dict[str, Any]) -> tuple[str, str, str]:
    labels = a["labels"]
    return (
        labels.get("building") or NONE,
        labels.get("floor") or NONE,
        labels.get("room") or NONE,
    )


def _order(a: dict[str, Any]) -> tuple[Any, ...]:
    b, f, rm = _place(a)
    # "—" after every named place; most severe first, then most recent
    return (b == NONE, b, f == NONE, f, rm == NONE, rm, SEVERITIES.index(a["severity"])
            if a["severity"] in SEVERITIES else len(SEVERITIES), -a["last_seen"], a["id"])  # fmt: skip


def paginate(alarms: list[dict[str, Any]], page: int, per_page: int = PER_PAGE) -> AlarmPage:
    """Sort by place, cut one page, group it (a group split by a page break repeats its
    heading on the next page)."""
    counts = {s: 0 for s in SEVERITIES}
    for a in alarms:
        counts[a["severity"]] = counts.get(a["severity"], 0) + 1
    alarms.sort(key=_order)
    pages = max(1, -(-len(alarms) // per_page))
    page = min(max(page, 1), pages)
    groups: list[Group] = []
    for a in alarms[(page - 1) * per_page : page * per_page]:
        where = _place(a)
        if not groups or groups[-1].path != where:
            groups.append(Group(where))
        groups[-1].alarms.append(a)
    return AlarmPage(groups, len(alarms), page, pages, counts)


def parse_filter(labels: str) -> list[Any]:
    """The filter field: matchers separated by spaces or commas (``building=A floor=~1|2``)."""
    return als.parse_matchers(m for m in re.split(r"[\s,]+", labels.strip()) if m)


def open_alarms(r: Any, labels: str, state: str) -> list[dict[str, Any]]:
    found = als.list_alarms(r, None if state in ("", OPEN, "all") else state, None,
                            parse_filter(labels))  # fmt: skip
    if state in ("", OPEN):
        found = [a for a in found if a["state"] != "cleared-acknowledged"]
    return found


def _table(request: Request, r: Any, labels: str, state: str, page: int, notice: str = "",
           status: int = 200) -> HTMLResponse:  # fmt: skip
    error = ""
    try:
        t0 = time.perf_counter()
        view = paginate(open_alarms(r, labels, state), page)
        took = time.perf_counter() - t0
    except SilenceError as exc:
        error, view, took = str(exc), paginate([], 1), 0.0
        status = 422
    name = "_alarms.html" if web.is_htmx(request) else "alarms.html"
    return web.page(
        request, name, status, view=view, labels=labels, state=state, error=error,
        notice=notice, took=took, states=[OPEN, "all", *api.STATES], severities=SEVERITIES,
        query={"labels": labels, "state": state, "page": view.page},
    )  # fmt: skip


@router.get("/console/alarms", response_class=HTMLResponse)
def alarms_page(
    request: Request,
    _u: User,
    r: R,
    labels: Annotated[str, Query()] = "",
    state: Annotated[str, Query()] = OPEN,
    page: Annotated[int, Query()] = 1,
) -> HTMLResponse:
    """The open alarms; htmx asks for the table alone (filter, pages, live updates)."""
    return _table(request, r, labels, state, page)


def _reply(resp: Response) -> tuple[int, str]:
    body = json.loads(bytes(resp.body)) if resp.body else {}
    return resp.status_code, body.get("error", "")


Labels = Annotated[str, Form()]
State = Annotated[str, Form()]
Page = Annotated[int, Form()]


def _after_action(
    request: Request, r: Any, aid: str, done: str, resp: Response, view: tuple[str, str, int]
) -> Response:
    """The table again (htmx) with what happened, or back to the page (a plain form)."""
    status, error = _reply(resp)
    notice = done if status < 300 else f"{aid}: {error} ({status})"
    if web.is_htmx(request):
        return _table(request, r, *view, notice)
    if status >= 300:
        return web.page(request, "message.html", status, title="Not done", message=notice)
    return web.back(request, f"/console/alarms/{aid}")


@router.post("/console/alarms/{aid}/{action}", dependencies=[Csrf])
def act(
    request: Request,
    aid: str,
    action: Literal["ack", "clear"],
    u: User,
    r: R,
    note: Annotated[str, Form()] = "",
    reason: Annotated[str, Form()] = "",
    labels: Labels = "",
    state: State = OPEN,
    page: Page = 1,
) -> Response:
    """Acknowledge (an ack token may) or clear by hand (management only): the function of
    `POST /v1/alarms/{id}/ack` or `/clear`."""
    if action == "ack":
        resp = api.ack_alarm(aid, u.who, r, api.AckIn(note=note))
    else:
        web.admin_user(u)
        resp = api.clear_alarm(aid, api.ClearIn(reason=reason or "cleared in the console"), None, r)
    done = f"{aid} {'acknowledged' if action == 'ack' else 'cleared'}"
    return _after_action(request, r, aid, done, resp, (labels, state, page))


@router.get("/console/alarms/{aid}", response_class=HTMLResponse)
def alarm_detail(request: Request, aid: str, _u: User, r: R) -> HTMLResponse:
    """One alarm: its record, the timeline of its transitions, the events of each match."""
    rec = als.get_alarm(r, aid)
    if rec is None:
        return web.page(request, "message.html", 404, title="No such alarm",
                        message=f"no alarm {aid!r}")  # fmt: skip
    timeline = als.history(r, alarm=rec["id"])
    timeline.reverse()  # newest first
    uri = request.app.state.settings.archive_uri
    events = evidence.match_events(uri, timeline)
    prof = rs.get_profile(r, rec["profile"])
    trace = evidence.explain(prof, list(events.values()), rec["last_seen"] + 1) if prof else []
    return web.page(request, "alarm.html", alarm=rec, timeline=timeline, events=events,
                    trace=trace, archive=bool(uri))  # fmt: skip
