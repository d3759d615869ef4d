"""`/v1/gateways`, `/v1/outbox` (read-only) and `/v1/dead-letters` (admin token): what `ens
gateway`, `ens notifications tail` and `ens notifications dead-letter` manage, over HTTP, with
the same rules and store functions (`adapters.service.admin`, `redis_store`, `notifiers.store`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from adapters.errors import Refused
from adapters.service import admin
from adapters.service import redis_store as rs
from adapters.service.routes.base import Admin, ErrorOut, R
from notifiers import store

router = APIRouter()

LATENESS = (
    "how far out of ts order its events may arrive: a duration (0, 500ms, 2s) or `default` "
    "(the service's --default-lateness)"
)


class GatewayOut(BaseModel):
    name: str
    created: float
    revoked: float | None = Field(None, description="when its key was revoked")
    lateness: float | None = Field(None, description="seconds; null: the service's default")


class GatewayIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(examples=["lobby"])
    lateness: str | None = Field(None, description=LATENESS, examples=["2s"])


class GatewayCreated(GatewayOut):
    api_key: str = Field(description="shown in this answer only: only its hash is stored")


class GatewaySet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lateness: str = Field(description=LATENESS, examples=["default"])


def _lateness(text: str | None) -> float | None:
    try:
        return admin.parse_lateness(text, "lateness")
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None


def _gateway(r: Any, name: str) -> dict[str, Any]:
    found = [g for g in rs.list_gateways(r) if g["name"] == name]
    if not found:
        raise HTTPException(404, f"no gateway {name!r}")
    return found[0]


@router.get("/v1/gateways", response_model=list[GatewayOut], tags=["gateways"])
def list_gateways(_: Admin, r: R) -> list[dict[str, Any]]:
    """Every gateway (`ens gateway list`): names, creation, revocation, lateness; never keys."""
    return rs.list_gateways(r)


@router.post(
    "/v1/gateways",
    response_model=GatewayCreated,
    status_code=201,
    tags=["gateways"],
    responses={409: {"model": ErrorOut}, 422: {"model": ErrorOut}},
)
def add_gateway(body: GatewayIn, _: Admin, r: R) -> GatewayCreated:
    """Create a gateway and return its API key, once (`ens gateway add`); 409 while a gateway
    of that name has a key that is not revoked."""
    late = _lateness(body.lateness)
    try:
        key = admin.add_gateway(r, body.name, late)
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return GatewayCreated(**_gateway(r, body.name), api_key=key)


@router.patch(
    "/v1/gateways/{name}",
    response_model=GatewayOut,
    tags=["gateways"],
    responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}},
)
def set_gateway(name: str, body: GatewaySet, _: Admin, r: R) -> dict[str, Any]:
    """Change a gateway's lateness (`ens gateway set`); the running engine applies it at once."""
    try:
        admin.set_gateway(r, name, _lateness(body.lateness))
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return _gateway(r, name)


@router.delete(
    "/v1/gateways/{name}",
    status_code=204,
    tags=["gateways"],
    responses={404: {"model": ErrorOut}},
)
def revoke_gateway(name: str, _: Admin, r: R) -> Response:
    """Revoke a gateway's API key (`ens gateway revoke`): its requests get 403 from now on; it
    stays listed as revoked."""
    try:
        admin.revoke_gateway(r, name)
    except Refused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return Response(status_code=204)


class OutboxEntry(BaseModel):
    entry: str = Field(description="the outbox stream id (use it as `after` to read on)")
    notification: dict[str, Any]


@router.get("/v1/outbox", response_model=list[OutboxEntry], tags=["outbox"])
def read_outbox(
    _: Admin,
    r: R,
    after: Annotated[
        str | None, Query(description="only entries after this id (the last one read)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> list[OutboxEntry]:
    """Notifications in the outbox, oldest first (`ens notifications tail`): without ``after``
    the last ``limit`` of them, with it the next ``limit`` after that entry. Read-only."""
    if after is None:
        newest: Any = r.xrevrange(store.OUTBOX, count=limit)  # redis-py types replies loosely
        rows: Any = list(reversed(newest))
    else:
        try:
            store.entry_order(after)
        except ValueError:
            raise HTTPException(422, f"after {after!r} is not an outbox entry id") from None
        rows = r.xrange(store.OUTBOX, min=f"({after}", count=limit)
    out = []
    for eid, fields in rows:
        raw = fields.get(store.OUTBOX_FIELD)
        out.append(OutboxEntry(entry=eid, notification=json.loads(raw) if raw else dict(fields)))
    return out


class DeadLetterOut(BaseModel):
    id: str = Field(description="the notification id")
    entry: str = Field(description="the dead letter's own stream id")
    profile: str | None
    channel: str = Field(description="as `ens notifications dead-letter list` shows it (masked)")
    ch: int = Field(description="the channel's index; -1: no channel could be resolved")
    error: str
    attempts: int
    ts: float


class RetryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: list[str] = Field(
        default_factory=list, description="notification ids or dead-letter entry ids"
    )
    all: bool = Field(False, description="retry every dead letter")


class RetryOut(BaseModel):
    scheduled: int
    unknown: list[str] = Field(default_factory=list, description="ids no dead letter matches")


@router.get("/v1/dead-letters", response_model=list[DeadLetterOut], tags=["dead letters"])
def list_dead_letters(
    _: Admin, r: R, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> list[DeadLetterOut]:
    """Notifications that could not be delivered, oldest first (`ens notifications
    dead-letter list`); channels without secrets, webhook URLs masked."""
    return [
        DeadLetterOut(
            id=dl.nid,
            entry=dl.entry,
            profile=dl.notification.get("profile"),
            channel=store.describe_channel(dl.channel),
            ch=dl.ch,
            error=dl.error,
            attempts=dl.attempts,
            ts=dl.ts,
        )
        for dl in store.list_dead_letters(r, count=limit)
    ]


@router.post(
    "/v1/dead-letters/retry",
    response_model=RetryOut,
    tags=["dead letters"],
    responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}},
)
def retry_dead_letters(body: RetryIn, _: Admin, r: R) -> RetryOut:
    """Put dead letters back on the retry schedule with their attempts reset (`ens
    notifications dead-letter retry`); 404 if none matches."""
    if bool(body.ids) == body.all:
        raise HTTPException(422, "give ids or all: true (not both)")
    unknown: list[str] = []
    if body.ids:
        known = {k for dl in store.list_dead_letters(r) for k in (dl.nid, dl.entry)}
        unknown = [i for i in body.ids if i not in known]
    moved = store.retry_dead_letters(r, None if body.all else body.ids)
    if body.ids and not moved:
        raise HTTPException(404, f"no dead letter matches {', '.join(body.ids)}")
    return RetryOut(scheduled=moved, unknown=unknown)
