"""`/v1/alarms` and `/v1/silences` (docs/alarms.md): list, acknowledge and clear alarms,
their history, silences.

Reads come from Redis (the ``ens:alarms`` index, the history stream, ``ens:silences``).
Changes are commands to the engine worker, which owns the alarm state
(`adapters.service.alarm_store`): the request waits for its reply, so a 404 or 409 comes from
the state that decides. Listing and acknowledging take the admin token or a token of scope
``ack`` (`ens token add`); clearing and silences take the admin token.
"""

from __future__ import annotations

from typing import Annotated, Any

import redis
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from adapters.service import alarm_store as als
from adapters.service.routes.base import AckOrAdmin, Admin, ErrorOut, R
from notifiers.alarms import STATES, SilenceError
from profiles.alarm import SEVERITIES

router = APIRouter()
WAIT = 10.0  # s a change waits for the engine worker's reply (503 after)


class ConflictOut(BaseModel):
    error: str
    state: str = Field(description="the alarm's state (it is already there)")


class SilenceErrorOut(BaseModel):
    error: str
    field: str = Field(description="the field of the silence that is wrong")


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = ""


class ClearIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1)


class SilenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    matchers: list[str] = Field(examples=[["building=A", "floor=3"]])
    from_: Any = Field(default=None, alias="from", description="RFC 3339 or epoch s; default now")
    until: Any = None
    for_: str | None = Field(default=None, alias="for", examples=["2h"])
    weekly: str | None = Field(default=None, examples=["Mon-Fri 07:00-09:00"])
    tz: str | None = Field(default=None, examples=["Europe/Berlin"])
    comment: str = ""
    creator: str | None = None
    notify_after: bool = True


def _matchers(match: list[str] | None) -> list[Any]:
    try:
        return als.parse_matchers(match or [])
    except SilenceError as exc:
        raise HTTPException(422, f"match: {exc}") from None


def _send(r: redis.Redis, op: str, args: dict[str, Any]) -> JSONResponse:
    try:
        reply = als.send_command(r, op, args, WAIT)
    except als.WorkerUnavailable as exc:
        return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "1"})
    status = int(reply.pop("status"))
    return JSONResponse(reply, status)


@router.get("/v1/alarms", tags=["alarms"], responses={422: {"model": ErrorOut}})
def list_alarms(
    _who: AckOrAdmin,
    r: R,
    state: Annotated[str | None, Query(description=" | ".join(STATES))] = None,
    severity: Annotated[str | None, Query(description=" | ".join(SEVERITIES))] = None,
    match: Annotated[
        list[str] | None, Query(description="label matchers: room=101, building=~A|B (repeat)")
    ] = None,
) -> list[dict[str, Any]]:
    """Alarms (the current occurrence of each), most recently seen first."""
    if state is not None and state not in STATES:
        raise HTTPException(422, f"state: {state!r} is not one of {', '.join(STATES)}")
    if severity is not None and severity not in SEVERITIES:
        raise HTTPException(422, f"severity: {severity!r} is not one of {', '.join(SEVERITIES)}")
    return als.list_alarms(r, state, severity, _matchers(match))


@router.get("/v1/alarms/history", tags=["alarms"], responses={422: {"model": ErrorOut}})
def alarm_history(
    _who: AckOrAdmin,
    r: R,
    match: Annotated[list[str] | None, Query(description="label matchers (repeat)")] = None,
    since: Annotated[
        str | None, Query(description="a duration back from now (7d) or an RFC 3339 time")
    ] = None,
    alarm: Annotated[str | None, Query(description="an alarm id or ID.N")] = None,
) -> list[dict[str, Any]]:
    """Transitions (oldest first): time, kind, actor, reason, states, labels, delivery."""
    return als.history(r, _matchers(match), _since(since), alarm)


def _since(since: str | None) -> float | None:
    try:
        return als.parse_since(since)
    except ValueError as exc:
        raise HTTPException(422, f"since: {exc}") from None


@router.get("/v1/alarms/{aid}", tags=["alarms"], responses={404: {"model": ErrorOut}})
def get_alarm(aid: str, _who: AckOrAdmin, r: R) -> dict[str, Any]:
    rec = als.get_alarm(r, aid)
    if rec is None:
        raise HTTPException(404, f"no alarm {aid!r}")
    rec["escalation"] = als.next_escalation(r, rec)  # the next step and when (None: none)
    return rec


@router.post(
    "/v1/alarms/{aid}/ack",
    tags=["alarms"],
    responses={
        404: {"model": ErrorOut},
        409: {"model": ConflictOut, "description": "already acknowledged"},
        503: {"model": ErrorOut, "description": "the engine worker did not answer"},
    },
)
def ack_alarm(aid: str, who: AckOrAdmin, r: R, body: AckIn | None = None) -> JSONResponse:
    """Acknowledge an alarm (its id, or ``ID.N`` for one occurrence)."""
    return _send(r, "ack", {"id": aid, "actor": who, "note": body.note if body else ""})


@router.post(
    "/v1/alarms/{aid}/clear",
    tags=["alarms"],
    responses={
        404: {"model": ErrorOut},
        409: {"model": ConflictOut, "description": "already cleared"},
        503: {"model": ErrorOut},
    },
)
def clear_alarm(aid: str, body: ClearIn, _: Admin, r: R) -> JSONResponse:
    """Clear an active alarm by hand, with a reason."""
    return _send(r, "clear", {"id": aid, "actor": "admin", "reason": body.reason})


@router.post(
    "/v1/silences",
    tags=["alarms"],
    status_code=201,
    responses={422: {"model": SilenceErrorOut}, 503: {"model": ErrorOut}},
)
def add_silence(body: SilenceIn, _: Admin, r: R) -> JSONResponse:
    """Hold back deliveries of the alarms every matcher matches: a range (from/until or for)
    or a weekly window in a time zone. A bad field is a 422 naming it; nothing is stored."""
    data = body.model_dump(by_alias=True, exclude_none=True)
    data.setdefault("creator", "admin")
    out = _send(r, "silence", {"actor": data["creator"], "silence": data})
    if out.status_code == 200:
        out.status_code = 201
    return out


@router.get("/v1/silences", tags=["alarms"])
def list_silences(_: Admin, r: R) -> list[dict[str, Any]]:
    """Every silence, expired ones too (``expired_at``)."""
    return als.list_silences(r)


@router.delete(
    "/v1/silences/{sid}",
    tags=["alarms"],
    responses={404: {"model": ErrorOut}, 422: {"model": SilenceErrorOut}},
)
def expire_silence(sid: str, _: Admin, r: R) -> JSONResponse:
    """Expire a silence now (it stays, expired, in the list)."""
    return _send(r, "expire", {"id": sid})
