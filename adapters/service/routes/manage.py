"""`/v1/profiles` and `/v1/subscribers` (admin token): what the engine matches and whom it
notifies. The running engine picks changes up at once (the control stream)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from adapters.service import admin
from adapters.service import redis_store as rs
from adapters.service.routes.base import Admin, ErrorOut, R
from notifiers import store, subscriber_change
from profiles.errors import ProfileError

router = APIRouter()


class ProfileIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt `subscribr` is an error, not dropped
    id: str = Field(examples=["p4"])
    expr: str = Field(
        examples=[
            'seq(w: kind = "window" and state = "broken", p: kind = "presence") within 30m per room'
        ]
    )
    subscriber: str | None = Field(default=None, description="an existing subscriber id")
    alarm: dict[str, Any] | None = Field(
        default=None,
        description="the profile is an alarm (docs/alarms.md): severity, clear, notify",
        examples=[{"severity": "major", "clear": "after 30m", "notify": ["raise", "clear"]}],
    )


class ProfileOut(ProfileIn):
    model_config = ConfigDict(extra="ignore")
    created: float
    updated: float | None = None


class ProfileStored(ProfileOut):
    warnings: list[str] = Field(
        default_factory=list,
        description="what looks wrong but is valid: no subscriber, a number read as infinity, "
        "an attribute no recent event has carried",
    )
    status: str = Field("created", description="created, replaced or unchanged")
    changes: list[str] = Field(
        default_factory=list, description="what a replacement changed: - stored / + sent"
    )


class ProfileErrorOut(BaseModel):
    error: str = Field(description="the message `ens check` prints")
    profile: str | None = None
    line: int | None = Field(default=None, description="1-based, inside expr")
    column: int | None = None
    expected: list[str] = Field(default_factory=list)


class SubscriberOut(BaseModel):
    id: str
    channels: list[dict[str, Any]]
    digest: float | None = None
    templates: dict[str, str] | None = Field(
        default=None, description="message templates by name (docs/notifiers.md#templates)"
    )
    has_secret: bool = Field(description="a signing secret is set (never shown after creation)")


def _redact(sub: store.Subscriber) -> SubscriberOut:
    return SubscriberOut(
        id=sub.id,
        channels=[store.redact(c.model_dump(exclude_none=True)) for c in sub.channels],
        digest=sub.digest,
        templates=sub.templates,
        has_secret=bool(sub.secret) or any(getattr(c, "secret", None) for c in sub.channels),
    )


@router.get("/v1/profiles", response_model=list[ProfileOut], tags=["profiles"])
def list_profiles(_: Admin, r: R) -> list[dict[str, Any]]:
    """Every stored profile, oldest first."""
    return rs.list_profiles(r)


@router.post(
    "/v1/profiles",
    response_model=ProfileStored,
    status_code=201,
    tags=["profiles"],
    responses={
        200: {"model": ProfileStored, "description": "replaced an existing profile"},
        415: {"model": ErrorOut, "description": "the body is not sent as JSON"},
        422: {"model": ProfileErrorOut, "description": "the profile does not parse/validate"},
    },
)
def add_profile(body: ProfileIn, _: Admin, r: R) -> JSONResponse:
    """Validate and store a profile; the running engine picks it up without a restart.

    The rules of `ens profile add --replace` (`adapters.service.admin`): replacing a profile
    (same id, another definition) drops its partial matches, and ``changes`` shows what changed
    (- stored / + sent); the same definition again changes nothing (``status`` unchanged).
    """
    try:
        prof = rs.validate_profile(r, body.id, body.expr, body.subscriber)
        alarm = None if body.alarm is None else rs.validate_alarm(prof, body.alarm).to_json()
    except ProfileError as exc:
        out = ProfileErrorOut(
            error=str(exc),
            profile=exc.profile_id,
            line=exc.line,
            column=exc.column,
            expected=exc.expected,
        )
        return JSONResponse(out.model_dump(), 422)
    change = admin.plan_profile(r, prof, alarm)
    rec = admin.apply_profile(r, change)
    stored = ProfileStored(
        **rec,
        warnings=admin.profile_warnings(r, prof),
        status={"new": "created", "changed": "replaced"}.get(change.status, change.status),
        changes=change.lines,
    )
    return JSONResponse(stored.model_dump(), 201 if change.status == "new" else 200)


@router.get(
    "/v1/profiles/{pid}",
    response_model=ProfileOut,
    tags=["profiles"],
    responses={404: {"model": ErrorOut}},
)
def get_profile(pid: str, _: Admin, r: R) -> dict[str, Any]:
    rec = rs.get_profile(r, pid)
    if rec is None:
        raise HTTPException(404, f"no profile {pid!r}")
    return rec


@router.delete(
    "/v1/profiles/{pid}",
    status_code=204,
    tags=["profiles"],
    responses={404: {"model": ErrorOut}},
)
def delete_profile(pid: str, _: Admin, r: R) -> Response:
    """Remove a profile; the engine drops it (and its partial matches) at once."""
    if not rs.delete_profile(r, pid):
        raise HTTPException(404, f"no profile {pid!r}")
    return Response(status_code=204)


@router.get("/v1/subscribers", response_model=list[SubscriberOut], tags=["subscribers"])
def list_subscribers(_: Admin, r: R) -> list[SubscriberOut]:
    """Every subscriber; signing secrets are never shown, webhook URLs are masked (`<secret>`
    for their password and query values)."""
    out = []
    for raw in r.hgetall(store.SUBSCRIBERS).values():
        out.append(_redact(store.Subscriber.model_validate_json(raw)))
    return sorted(out, key=lambda s: s.id)


@router.get(
    "/v1/subscribers/{sid}",
    response_model=SubscriberOut,
    tags=["subscribers"],
    responses={404: {"model": ErrorOut}},
)
def get_subscriber(sid: str, _: Admin, r: R) -> SubscriberOut:
    sub = store.get_subscriber(r, sid)
    if sub is None:
        raise HTTPException(404, f"no subscriber {sid!r}")
    return _redact(sub)


@router.get(
    "/v1/subscribers/{sid}/status",
    tags=["subscribers"],
    responses={404: {"model": ErrorOut}},
)
def subscriber_delivery_status(sid: str, _: Admin, r: R) -> dict[str, Any]:
    """Its deliveries: counts of outcomes (delivered, retried attempts, dead-lettered), what is
    pending or retrying now, dead letters not yet retried, the last success and error, and the
    circuit breaker of each of its destinations (closed, open, half-open)."""
    sub = store.get_subscriber(r, sid)
    if sub is None:
        raise HTTPException(404, f"no subscriber {sid!r}")
    from notifiers.status import subscriber_status

    (out,) = subscriber_status(r, [sub])
    return out


class SubscriberConflictOut(ErrorOut):
    changes: list[str] = Field(description="- stored / + sent (webhook URLs masked)")


_STORED: dict[int | str, dict[str, Any]] = {
    200: {"description": "unchanged (the same definition), replaced, or the secret rotated"},
    409: {"model": SubscriberConflictOut, "description": "stored with another definition"},
    422: {"description": "invalid subscriber"},
}
RotateSecret = Annotated[
    bool,
    Query(description="Give the subscriber a new webhook signing secret (shown once)."),
]


def _store_subscriber(r: R, body: store.Subscriber, replace: bool, rotate: bool) -> JSONResponse:
    """`notifiers.subscriber_change`, the rule `ens subscriber add` applies too."""
    try:
        rs.check_id(body.id, "subscriber id")
        change = subscriber_change.plan(r, body, rotate=rotate)
    except ProfileError as exc:
        return JSONResponse({"error": str(exc)}, 422)
    except ValidationError as exc:
        return JSONResponse({"error": store.subscriber_error(exc)}, 422)
    if change.needs_replace and not replace:
        how = f"PUT /v1/subscribers/{body.id} replaces it"
        out = SubscriberConflictOut(error=change.refusal(how), changes=change.lines)
        return JSONResponse(out.model_dump(), 409)
    saved, secret = subscriber_change.apply(r, change)
    body_out = json.loads(saved.to_json())
    body_out.pop("secret", None)
    if secret or body.secret:  # generated now (shown once), or the caller's own
        body_out["secret"] = saved.secret
    for channel in body_out.get("channels", []):
        if "webhook" in channel:
            channel["webhook"] = store.redact(channel)["webhook"]
    status = {"new": "created", "changed": "replaced"}.get(change.status, change.status)
    body_out.update(status=status, changes=change.lines)
    return JSONResponse(body_out, 201 if change.status == "new" else 200)


@router.post(
    "/v1/subscribers",
    status_code=201,
    tags=["subscribers"],
    response_model=store.Subscriber,
    responses=_STORED,
)
def add_subscriber(
    body: store.Subscriber, _: Admin, r: R, rotate_secret: RotateSecret = False
) -> JSONResponse:
    """Store a new subscriber; 409 if its id is stored with another definition (`PUT`
    replaces), 200 ``unchanged`` if with the same one.

    A webhook without a secret gets a generated one: the response shows it, once. Webhook
    URLs are shown masked (`store.redact`), as everywhere: the caller has them. ``status``
    says what happened, ``changes`` shows it (- stored / + sent).
    """
    return _store_subscriber(r, body, replace=False, rotate=rotate_secret)


@router.put(
    "/v1/subscribers/{sid}",
    status_code=200,
    tags=["subscribers"],
    response_model=store.Subscriber,
    responses={201: {"description": "created"}, **_STORED},
)
def put_subscriber(
    sid: str, body: store.Subscriber, _: Admin, r: R, rotate_secret: RotateSecret = False
) -> JSONResponse:
    """Store a subscriber, replacing one of the same id (`ens subscriber add --replace`).

    A replaced subscriber keeps its webhook signing secret (its receivers go on verifying)
    unless the body gives one or ``rotate_secret`` asks for a new one (shown once).
    """
    if body.id != sid:
        return JSONResponse({"error": f"body id {body.id!r} is not the path's {sid!r}"}, 422)
    return _store_subscriber(r, body, replace=True, rotate=rotate_secret)


@router.delete(
    "/v1/subscribers/{sid}",
    status_code=204,
    tags=["subscribers"],
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
)
def delete_subscriber(sid: str, _: Admin, r: R) -> Response:
    """Remove a subscriber that no profile uses (409 lists the profiles that do)."""
    users = rs.profiles_of_subscriber(r, sid)
    if users:
        raise HTTPException(409, f"subscriber {sid!r} is used by profiles {users}")
    if not r.hdel(store.SUBSCRIBERS, sid):
        raise HTTPException(404, f"no subscriber {sid!r}")
    return Response(status_code=204)
