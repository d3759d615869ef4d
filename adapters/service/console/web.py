"""What every console page shares: the templates, the logged-in operator (a dependency), the
CSRF check, and the answers for "log in first" and "not with this token"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import redis
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

import adapters.service.console.session as session
from adapters.errors import NeedLogin as NeedLogin
from adapters.errors import NotAllowed as NotAllowed
from adapters.service.routes.base import sync_redis

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescape on for .html


def _when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def _ago(ts: float | None) -> str:
    if ts is None:
        return "never"
    d = max(time.time() - ts, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if d >= size:
            return f"{d / size:.0f} {unit} ago"
    return f"{d:.0f} s ago"


templates.env.filters["when"] = _when
templates.env.filters["ago"] = _ago
templates.env.globals["urlencode"] = urlencode


def user(request: Request) -> session.User:
    u = session.load(sync_redis(request), request.cookies.get(session.COOKIE))
    if u is None:
        raise NeedLogin()
    request.state.console_user = u
    return u


def admin_user(u: Annotated[session.User, Depends(user)]) -> session.User:
    if not u.admin:
        raise NotAllowed()
    return u


User = Annotated[session.User, Depends(user)]
AdminUser = Annotated[session.User, Depends(admin_user)]
R = Annotated[redis.Redis, Depends(sync_redis)]


async def csrf(request: Request) -> None:
    """Every state-changing request carries the session's CSRF token: the form field ``csrf``
    or the ``X-CSRF-Token`` header htmx sends (base.html)."""
    u = user(request)
    given = request.headers.get("x-csrf-token")
    if given is None:
        form = await request.form()
        value = form.get("csrf")
        given = value if isinstance(value, str) else None
    if not session.csrf_ok(u.csrf, given):
        raise NotAllowed()


Csrf = Depends(csrf)


def page(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    """A template with the operator and the navigation; partials (``_*.html``) too."""
    u = getattr(request.state, "console_user", None)
    return templates.TemplateResponse(request, name, {"user": u, **ctx}, status_code=status)


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def back(request: Request, default: str) -> Response:
    """After a plain (no-JS) form post: back to the page it came from."""
    target = request.query_params.get("next") or default
    if not target.startswith("/console"):
        target = default
    return RedirectResponse(target, 303)
