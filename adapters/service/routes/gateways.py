"""Gateways: the API-key check of `POST /v1/events`.

Gateways are created, changed and revoked with `ens gateway` (Redis, no HTTP route); this
router-side part finds the gateway of a request's key, with a per-process cache that the ingest
script's own check keeps safe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from adapters.service import metrics as m
from adapters.service import redis_store as rs

_gateway_bearer = HTTPBearer(
    auto_error=False, scheme_name="GatewayKey", description="a gateway API key (ens gateway add)"
)
_gateway_header = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="GatewayKeyHeader")


async def require_gateway(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_gateway_bearer)],
    header: Annotated[str | None, Security(_gateway_header)],
) -> str:
    """The gateway name of a valid, unrevoked API key (401 unknown/missing, 403 revoked)."""
    key = header or (bearer.credentials if bearer else None)
    if not key:
        m.REQUESTS.labels(status="401").inc()
        raise HTTPException(
            401,
            "missing API key (Authorization: Bearer KEY or X-API-Key)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.api_key = key
    cache: KeyCache = request.app.state.key_cache
    hit = cache.get(key)
    if hit is not None:
        request.state.key_sha256 = hit[1]
        return hit[0]
    name = rs.gateway_of_key(key)
    raw = await request.app.state.aredis.hget(rs.GATEWAYS, name) if name else None
    check = rs.check_key_record(raw, key)
    if check.status != "ok" or check.gateway is None:
        raise key_refused(check.status, check.gateway)
    request.state.key_sha256 = cache.put(key, check.gateway)
    return check.gateway


def key_refused(status: str, gateway: str | None) -> HTTPException:
    """The answer to a key found `revoked` (403) or `unknown` (401), counted: when the key is
    checked before the body is read, and when the ingest script re-checks a cached one."""
    if status == "revoked":
        m.REQUESTS.labels(status="403").inc()
        return HTTPException(403, f"the API key of gateway {gateway!r} is revoked")
    m.REQUESTS.labels(status="401").inc()
    return HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})


class KeyCache:
    """Gateway keys this process has verified: key -> (gateway, its SHA-256).

    Saves a Redis round trip per request. It is safe because the ingest write re-checks the
    key in the same atomic script (`rs.INGEST_SCRIPT`): a key revoked since it was cached is
    refused on its next request, and then dropped from here.
    """

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self.keys: dict[str, tuple[str, str]] = {}

    def get(self, key: str) -> tuple[str, str] | None:
        return self.keys.get(key)

    def put(self, key: str, gateway: str) -> str:
        if len(self.keys) >= self.size:  # a flood of distinct valid keys: start over
            self.keys.clear()
        sha = rs.sha256(key)
        self.keys[key] = (gateway, sha)
        return sha

    def drop(self, key: str) -> None:
        self.keys.pop(key, None)


Gateway = Annotated[str, Depends(require_gateway)]
