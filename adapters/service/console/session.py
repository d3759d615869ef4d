"""Who is logged in to the console: sessions in Redis, CSRF tokens, the login rate limit.

A session is kept in Redis (every API process sees it; `ens serve --api-workers N`) under the
hash of its cookie value, so a copy of Redis holds no usable cookie. It records the role:
``admin`` (the management token: every page) or ``ack`` (a token of scope ``ack``: the
alarms and acknowledging them, nothing else), and the CSRF token every form carries. An ack
session is checked against ``ens:tokens`` on every request: a revoked token logs it out.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from notifiers.records import text

COOKIE = "ens_console"
LOGIN_COOKIE = "ens_console_login"  # the login form's CSRF value (double submit)
SESSION = "ens:console:session:"  # + sha256 of the cookie value
ATTEMPTS = "ens:console:login:"  # + client address: failed logins in the current window
SESSION_TTL = 8 * 3600  # s: a shift
LOGIN_WINDOW = 60  # s
LOGIN_MAX = 10  # failed attempts per client address and window (then 429 until it ends)


@dataclass(frozen=True)
class User:
    """A logged-in operator: who acts (``admin`` or ``token:NAME``), the role, the CSRF token."""

    who: str
    role: str  # "admin" | "ack"
    csrf: str
    token_sha: str = ""  # ack sessions: the token's hash (checked on every request)

    @property
    def admin(self) -> bool:
        return self.role == "admin"


def role_of(r: redis.Redis, token: str, admin_sha: str) -> tuple[str, str, str] | None:
    """(who, role, token hash) for a token, the same check as the HTTP API's bearer tokens
    (`routes.base.require_ack`); None for an unknown token."""
    sha = rs.sha256(token)
    if hmac.compare_digest(sha, admin_sha):
        return "admin", "admin", ""
    tok = als.token_of(r, sha)
    if tok is None or tok.get("scope") != "ack":
        return None
    return f"token:{tok['name']}", "ack", sha


def create(r: redis.Redis, who: str, role: str, token_sha: str) -> str:
    """A new session; its cookie value (only its hash is stored)."""
    sid = secrets.token_urlsafe(32)
    rec = {
        "who": who,
        "role": role,
        "csrf": secrets.token_urlsafe(24),
        "token": token_sha,
        "at": time.time(),
    }
    r.set(SESSION + rs.sha256(sid), json.dumps(rec), ex=SESSION_TTL)
    return sid


def load(r: redis.Redis, sid: str | None) -> User | None:
    """The session of a cookie value, or None (none, expired, or its ack token revoked)."""
    if not sid:
        return None
    raw = r.get(SESSION + rs.sha256(sid))
    if raw is None:
        return None
    rec: dict[str, Any] = json.loads(text(raw))
    if rec["role"] == "ack" and als.token_of(r, rec["token"]) is None:
        drop(r, sid)
        return None
    return User(rec["who"], rec["role"], rec["csrf"], rec.get("token", ""))


def drop(r: redis.Redis, sid: str | None) -> None:
    if sid:
        r.delete(SESSION + rs.sha256(sid))


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected, given or "")


def login_blocked(r: redis.Redis, client: str) -> int:
    """Seconds until this client may try again (0: it may now)."""
    key = ATTEMPTS + client
    n = r.get(key)
    if n is None or int(text(n)) < LOGIN_MAX:
        return 0
    return max(int(r.ttl(key)), 1)  # type: ignore[arg-type]


def login_failed(r: redis.Redis, client: str) -> None:
    key = ATTEMPTS + client
    with r.pipeline(transaction=True) as p:
        p.set(key, 0, ex=LOGIN_WINDOW, nx=True)  # the window starts at the first failure
        p.incr(key)
        p.execute()
