"""``POST /v1/subscribers/{id}/test`` (admin token): a test message to a subscriber's
channels, answered with what each receiver said (`notifiers.probe`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from adapters.service import metrics as m
from adapters.service.routes.base import Admin, ErrorOut, R
from notifiers import store

router = APIRouter()
MAX_DEADLINE = 60.0


class ProbeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: int | None = Field(
        default=None, ge=0, description="Only this channel (0-based, as listed) [each channel]."
    )
    deadline: float = Field(
        default=10.0, gt=0, le=MAX_DEADLINE, description="Seconds each send may take at most."
    )


class ProbeOut(BaseModel):
    channel: int
    kind: str = Field(description="webhook or email")
    to: str = Field(description="the channel (webhook URLs masked)")
    delivered: bool
    answer: str = Field(description="the receiver's answer: HTTP status, SMTP reply, or error")
    seconds: float
    id: str = Field(description="the message's id (its webhook Idempotency-Key)")


class ProbesOut(BaseModel):
    subscriber: str
    delivered: bool = Field(description="every channel tested took the message")
    results: list[ProbeOut]


@router.post(
    "/v1/subscribers/{sid}/test",
    response_model=ProbesOut,
    tags=["subscribers"],
    responses={404: {"model": ErrorOut}, 422: {"model": ErrorOut}, 503: {"model": ErrorOut}},
)
def test_subscriber(sid: str, _: Admin, r: R, body: ProbeIn | None = None) -> dict[str, Any]:
    """Send a real signed test message through the delivery senders to each channel (or the
    one given) and answer with each receiver's answer, within the deadline. Nothing is
    stored or retried; the answer is 200 whether or not the receivers took it (see
    ``delivered``)."""
    from notifiers.config import ConfigError, NotifierConfig
    from notifiers.probe import send_test

    body = body or ProbeIn()
    sub = store.get_subscriber(r, sid)
    if sub is None:
        raise HTTPException(404, f"no subscriber {sid!r}")
    try:
        config = NotifierConfig.load()
    except ConfigError as exc:
        raise HTTPException(503, f"the notifier settings do not load: {exc}") from None
    try:
        probes = send_test(sub, config, body.channel, body.deadline)
    except IndexError as exc:
        raise HTTPException(422, f"channel: {exc.args[0]}") from None
    for p in probes:
        m.SUBSCRIBER_TESTS.labels(outcome="delivered" if p.delivered else "failed").inc()
    return {
        "subscriber": sid,
        "delivered": all(p.delivered for p in probes),
        "results": [p.to_json() for p in probes],
    }
