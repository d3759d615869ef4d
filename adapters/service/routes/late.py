"""`/v1/late-events` (admin token): the late side output, events the engine worker could no
longer feed in ``ts`` order (`adapters.service.late`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from adapters.service import late
from adapters.service.routes.base import Admin, R

router = APIRouter()


class LateEventOut(BaseModel):
    entry: str = Field(description="the ens:late stream entry id")
    gateway: str
    key: str = Field(description="the event's ingest key (ingest entry id . index)")
    behind: float = Field(description="seconds the event's ts was behind the engine's time")
    written: float = Field(description="when the engine worker committed it (epoch seconds)")
    event: dict[str, Any] = Field(
        description="the event as the engine would have had it (id, ts in epoch seconds, "
        "attributes with the gateway stamp): "
        "one line of an `ens replay` event file",
        examples=[{"id": "c1", "ts": 1795300003.1, "kind": "door", "state": "close"}],
    )


class LateEventsOut(BaseModel):
    events: list[LateEventOut] = Field(description="the newest late events, oldest first")
    truncated: bool = Field(description="more late events matched than `limit`")
    stored: int = Field(description="late events kept in ens:late (all gateways; --late-max)")


@router.get("/v1/late-events", response_model=LateEventsOut, tags=["operations"])
def list_late_events(
    _: Admin,
    r: R,
    gateway: Annotated[str | None, Query(description="only this gateway's")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="at most this many")] = 100,
) -> dict[str, Any]:
    """Events that arrived too late to be matched in ``ts`` order (older than the engine's
    time when read). They were not matched; `ens notifications late export` writes them for
    ``ens replay``."""
    recs, more = late.list_late(r, gateway, limit)
    return {
        "events": [rec.to_json() for rec in recs],
        "truncated": more,
        "stored": int(r.xlen(late.LATE)),  # type: ignore[arg-type]
    }
