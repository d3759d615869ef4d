"""Silences (management only): create one for a building, floor or room for N hours or a
weekly window, list them, expire one. Creating and expiring call `POST /v1/silences` and
`DELETE /v1/silences/{id}`'s functions: a field the rules refuse comes back named (the
engine worker's ``field``), the form is shown again with the error at it and nothing stored."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

import adapters.service.console.web as web
from adapters.service import alarm_store as als
from adapters.service.console.web import AdminUser, Csrf, R
from adapters.service.routes import alarms as api

router = APIRouter()
PLACES = ("building", "floor", "room")


def _list(request: Request, r: Any, form: dict[str, str], errors: dict[str, str],
          notice: str = "", status: int = 200) -> HTMLResponse:  # fmt: skip
    silences = als.list_silences(r)
    silences.reverse()  # newest first
    return web.page(request, "silences.html", status, silences=silences, form=form,
                    errors=errors, notice=notice, places=PLACES)  # fmt: skip


@router.get("/console/silences", response_class=HTMLResponse)
def silences_page(request: Request, _u: AdminUser, r: R) -> HTMLResponse:
    return _list(request, r, {"kind": "hours", "hours": "2"}, {})


def silence_body(form: dict[str, str]) -> dict[str, Any]:
    """The `POST /v1/silences` body of the form; ValueError(field, message) for what the form
    itself must have (a place, hours as a number)."""
    matchers = [f"{p}={form[p].strip()}" for p in PLACES if form.get(p, "").strip()]
    if not matchers:
        raise ValueError("building", "give a building, a floor or a room (or several)")
    body: dict[str, Any] = {"matchers": matchers, "comment": form.get("comment", "")}
    if form.get("kind") == "weekly":
        body["weekly"] = form.get("weekly", "")
        if form.get("tz", "").strip():
            body["tz"] = form["tz"].strip()
    elif form.get("weekly", "").strip():
        raise ValueError("weekly", "a window is given but 'for N hours' is chosen: choose "
                         "'every week' for the window, or empty it")  # fmt: skip
    else:
        hours = form.get("hours", "").strip()
        try:
            n = float(hours)
        except ValueError:
            raise ValueError("hours", f"{hours!r} is not a number of hours") from None
        if not 0 < n <= 24 * 365:
            raise ValueError("hours", "give more than 0 and at most 8760 hours")
        body["for"] = f"{n * 3600:g}s"
    return body


# the engine worker names these fields of a silence; the form's fields that hold them
_AT = {"matchers": "building", "for": "hours", "until": "hours", "from": "hours"}


@router.post("/console/silences", dependencies=[Csrf])
def create_silence(
    request: Request,
    u: AdminUser,
    r: R,
    building: Annotated[str, Form()] = "",
    floor: Annotated[str, Form()] = "",
    room: Annotated[str, Form()] = "",
    kind: Annotated[str, Form()] = "hours",
    hours: Annotated[str, Form()] = "",
    weekly: Annotated[str, Form()] = "",
    tz: Annotated[str, Form()] = "",
    comment: Annotated[str, Form()] = "",
) -> Response:
    form = dict(building=building, floor=floor, room=room, kind=kind, hours=hours,
                weekly=weekly, tz=tz, comment=comment)  # fmt: skip
    try:
        body = api.SilenceIn.model_validate({**silence_body(form), "creator": "console"})
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            return _list(request, r, form, {"building": str(exc)}, status=422)
        where, message = exc.args
        return _list(request, r, form, {where: message}, status=422)
    resp = api.add_silence(body, None, r)
    reply = json.loads(bytes(resp.body))
    if resp.status_code >= 300:
        where = _AT.get(reply.get("field", ""), reply.get("field") or "building")
        return _list(request, r, form, {where: reply.get("error", "")}, status=resp.status_code)
    return _list(request, r, {"kind": "hours", "hours": "2"}, {},
                 notice=f"silence {reply.get('id') or reply.get('silence', {}).get('id', '')} created")  # fmt: skip


@router.post("/console/silences/{sid}/expire", dependencies=[Csrf])
def expire(request: Request, sid: str, _u: AdminUser, r: R) -> Response:
    resp = api.expire_silence(sid, None, r)
    reply = json.loads(bytes(resp.body))
    notice = f"silence {sid} expired" if resp.status_code < 300 else reply.get("error", "")
    return _list(request, r, {"kind": "hours", "hours": "2"}, {}, notice, resp.status_code)
