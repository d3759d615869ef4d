"""Logging in and out, and the live channel (server-sent events) the pages listen to.

Login takes the management token or an acknowledge-only token (`ens token add --scope ack`).
Failed attempts are counted per client address in Redis (all API processes share the count):
after `session.LOGIN_MAX` in `session.LOGIN_WINDOW` seconds the form answers 429 until the
window ends, whatever the token.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

import adapters.service.console.session as session
import adapters.service.console.web as web
from adapters.service import alarm_store as als
from adapters.service import metrics as m
from adapters.service.console.web import Csrf, R, User

router = APIRouter()
log = logging.getLogger("ens.service.console")
LIVE_SECONDS = 60.0  # one event stream lasts this long; the browser reconnects by itself
LIVE_BLOCK_MS = 2000  # and says something at least this often (a comment line); under the
# client's socket timeout (redis-py: 5 s), so that a quiet stream is no read timeout


def secure(request: Request) -> bool:
    """Behind TLS: the request's scheme, or the proxy's X-Forwarded-Proto."""
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip().lower() == "https"


def _cookie(request: Request, resp: Response, name: str, value: str, max_age: int) -> None:
    resp.set_cookie(name, value, max_age=max_age, path="/console", httponly=True,
                    samesite="strict", secure=secure(request))  # fmt: skip


def _form(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
    token = secrets.token_urlsafe(24)
    resp = web.page(request, "login.html", status, error=error, login_csrf=token)
    _cookie(request, resp, session.LOGIN_COOKIE, token, 3600)
    return resp


@router.get("/console/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    return _form(request)


@router.post("/console/login")
def login(
    request: Request,
    r: R,
    token: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    client = request.client.host if request.client else "?"
    if not session.csrf_ok(request.cookies.get(session.LOGIN_COOKIE, ""), csrf):
        return _form(request, "the form expired: log in again", 400)
    wait = session.login_blocked(r, client)
    if wait:
        m.CONSOLE_LOGINS.labels(result="limited").inc()
        log.warning("console: login from %s refused: too many failed attempts", client)
        return _form(request, f"too many failed attempts: try again in {wait} s", 429)
    found = session.role_of(r, token.strip(), request.app.state.settings.admin_token_sha256)
    if found is None:
        session.login_failed(r, client)
        m.CONSOLE_LOGINS.labels(result="refused").inc()
        log.info("console: failed login from %s", client)
        return _form(request, "unknown token", 401)
    who, role, sha = found
    sid = session.create(r, who, role, sha)
    m.CONSOLE_LOGINS.labels(result="ok").inc()
    log.info("console: %s logged in from %s (%s)", who, client, role)
    resp = RedirectResponse("/console/alarms", 303)
    _cookie(request, resp, session.COOKIE, sid, session.SESSION_TTL)
    resp.delete_cookie(session.LOGIN_COOKIE, path="/console")
    return resp


@router.post("/console/logout", dependencies=[Csrf])
def logout(request: Request, _u: User, r: R) -> Response:
    session.drop(r, request.cookies.get(session.COOKIE))
    resp = RedirectResponse("/console/login", 303)
    resp.delete_cookie(session.COOKIE, path="/console")
    return resp


@router.get("/console", include_in_schema=False)
def home() -> Response:
    return RedirectResponse("/console/alarms", 303)


async def _changes(request: Request, aredis: Any) -> AsyncIterator[str]:
    """``event: alarm`` whenever the alarm history grows (a raise, ack, clear, ...)."""
    given = request.headers.get("last-event-id", "")
    last = given if re.fullmatch(r"\d+-\d+", given) else "$"  # a reconnect misses nothing
    end = time.monotonic() + LIVE_SECONDS
    yield "retry: 1000\n\n"
    while time.monotonic() < end and not await request.is_disconnected():
        try:
            got = await aredis.xread({als.HISTORY: last}, count=100, block=LIVE_BLOCK_MS)
        except redis.RedisError as exc:  # the stream ends; the browser reconnects (Last-Event-ID)
            log.info("console: live stream ended: %s", exc)
            return
        if got:
            entries = got[0][1]
            last = entries[-1][0]
            yield f"id: {last}\nevent: alarm\ndata: {len(entries)}\n\n"
        else:
            yield ": idle\n\n"
        await asyncio.sleep(0)


@router.get("/console/live")
def live(request: Request, _u: User) -> StreamingResponse:
    """Server-sent events for the open page (htmx' SSE extension reloads its table)."""
    return StreamingResponse(
        _changes(request, request.app.state.aredis),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
