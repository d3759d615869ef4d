"""The console over plain HTTP against a real `ens serve` on a real redis-server: its security
(cookies, CSRF, CSP, the login rate limit, the ack token's limits), bad form input, 5,000 alarms
on one page in under a second, and `--no-console`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
import redis

from adapters.service import alarm_store as als
from adapters.service import redis_store as rs
from adapters.service.console import session
from tests.helpers_service import ADMIN_TOKEN, Service, client_fixtures, metric, serving, wait_for

pytestmark = pytest.mark.redis
PROFILE = {
    "id": "door",
    "expr": 'seq(d: kind = "door" and state = "open") per building, floor, room',
    "alarm": {"severity": "minor", "clear": "after 1d", "notify": []},
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("console-http")
    with serving(d, "--reorder-seconds", "0.1") as s:
        with s.client(admin=True) as admin:
            assert admin.post("/v1/profiles", json=PROFILE).status_code == 201
        yield s


r, _admin = client_fixtures()


def login_form(c: httpx.Client) -> str:
    page = c.get("/console/login")
    assert page.status_code == 200
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m
    return m.group(1)


def logged_in(svc: Service, token: str = ADMIN_TOKEN) -> tuple[httpx.Client, str]:
    """A client with a session cookie, and the session's CSRF token."""
    c = httpx.Client(base_url=svc.url, timeout=10)
    resp = c.post("/console/login", data={"token": token, "csrf": login_form(c)})
    assert resp.status_code == 303, resp.text
    page = c.get("/console/alarms")
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m
    return c, m.group(1)


def test_cookie_flags_and_security_headers(svc: Service) -> None:
    with httpx.Client(base_url=svc.url) as c:
        resp = c.post(
            "/console/login",
            data={"token": ADMIN_TOKEN, "csrf": login_form(c)},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert resp.status_code == 303
        cookie = resp.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie
    c, _csrf = logged_in(svc)
    with closing(c):
        page = c.get("/console/alarms")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "an inline script"
    assert not re.search(r"<[^>]+\son[a-z]+=", page.text), "an inline event handler"
    # without TLS the cookie is not Secure (it would never be sent back)
    with httpx.Client(base_url=svc.url) as c:
        resp = c.post("/console/login", data={"token": ADMIN_TOKEN, "csrf": login_form(c)})
        assert "Secure" not in resp.headers["set-cookie"]
    # every asset comes from the package
    assert httpx.get(svc.url + "/console/static/htmx.min.js").status_code == 200
    assert "cdn" not in page.text.lower()


def test_no_session_goes_to_login_and_bad_token_is_refused(svc: Service) -> None:
    with httpx.Client(base_url=svc.url) as c:
        resp = c.get("/console/alarms")
        assert resp.status_code == 303 and resp.headers["location"] == "/console/login"
        resp = c.post("/console/login", data={"token": "wrong", "csrf": login_form(c)})
        assert resp.status_code == 401 and "unknown token" in resp.text


def test_forms_without_the_csrf_token_change_nothing(svc: Service, r: redis.Redis) -> None:
    c, csrf = logged_in(svc)
    with closing(c):
        before = als.list_silences(r)
        resp = c.post("/console/silences", data={"building": "X", "hours": "1"})
        assert resp.status_code == 403
        resp = c.post("/console/silences", data={"building": "X", "hours": "1", "csrf": "no"})
        assert resp.status_code == 403
        assert als.list_silences(r) == before
        resp = c.post("/console/silences", data={"building": "X", "hours": "1", "csrf": csrf})
        assert resp.status_code == 200 and "created" in resp.text
        (made,) = [s for s in als.list_silences(r) if s not in before]
        assert made["matchers"] == ["building=X"]
        # leave none in force for the other tests
        assert c.post(f"/console/silences/{made['id']}/expire", data={"csrf": csrf}).is_success


@pytest.mark.parametrize(
    ("form", "field", "message"),
    [
        ({"hours": "2"}, "building", "give a building, a floor or a room"),
        ({"building": "A", "hours": "-1"}, "hours", "more than 0"),
        ({"building": "A", "kind": "weekly", "weekly": "Funday 9-5"}, "weekly", ""),
        ({"building": "A", "kind": "weekly", "weekly": "Mon 07:00-09:00", "tz": "Mars/X"}, "tz", ""),
        ({"room": "101", "hours": "two"}, "hours", "not a number of hours"),
        ({"room": "1", "hours": "2", "weekly": "Mon 07:00-09:00"}, "weekly", "every week"),
    ],
)  # fmt: skip
def test_bad_silence_form_is_shown_again_with_the_error_at_the_field(
    svc: Service, r: redis.Redis, form: dict[str, str], field: str, message: str
) -> None:
    c, csrf = logged_in(svc)
    with closing(c):
        before = als.list_silences(r)
        resp = c.post("/console/silences", data={**form, "csrf": csrf})
    assert resp.status_code == 422, resp.text
    m = re.search(rf'id="s-{field}-error"[^>]*>([^<]+)<', resp.text)
    assert m, resp.text
    assert message in m.group(1)
    for name, value in form.items():  # what was typed is kept
        if name not in ("kind", "csrf"):
            assert f'value="{value}"' in resp.text.replace("&#34;", '"')
    assert als.list_silences(r) == before


def test_ack_token_may_acknowledge_but_not_manage(svc: Service, r: redis.Redis) -> None:
    gw = svc.client(rs.add_gateway(r, "gw-ack"))
    ev = {"id": "a1", "ts": time.time(), "kind": "door", "state": "open",
          "building": "A", "floor": "1", "room": "ack-1"}  # fmt: skip
    assert gw.post("/v1/events", json=[ev]).status_code == 202
    found = wait_for(
        lambda: [a for a in als.list_alarms(r) if a["labels"].get("room") == "ack-1"], 15, "alarm"
    )
    aid = found[0]["id"]
    c, csrf = logged_in(svc, als.add_token(r, "ack-only"))
    with closing(c):
        assert c.get("/console/silences").status_code == 403
        resp = c.post(f"/console/alarms/{aid}/clear", data={"csrf": csrf, "reason": "x"})
        assert resp.status_code == 403
        assert als.get_alarm(r, aid)["state"] == "active-unacknowledged"  # type: ignore[index]
        resp = c.post(
            f"/console/alarms/{aid}/ack", data={"csrf": csrf}, headers={"HX-Request": "true"}
        )
        assert resp.status_code == 200 and "acknowledged" in resp.text
        rec = als.get_alarm(r, aid)
        assert rec is not None and rec["state"] == "active-acknowledged"
        assert rec["acked_by"] == "token:ack-only"
        resp = c.post(
            f"/console/alarms/{aid}/ack", data={"csrf": csrf}, headers={"HX-Request": "true"}
        )
        assert "409" in resp.text  # the API's answer: already acknowledged
        als.revoke_token(r, "ack-only")  # a revoked token's session ends at once
        assert c.get("/console/alarms").status_code == 303
    gw.close()


def test_login_attempts_are_rate_limited(svc: Service, r: redis.Redis) -> None:
    r.delete(session.ATTEMPTS + "127.0.0.1")  # another test's failed login
    with httpx.Client(base_url=svc.url) as c:
        for _ in range(session.LOGIN_MAX):
            resp = c.post("/console/login", data={"token": "guess", "csrf": login_form(c)})
            assert resp.status_code == 401
        resp = c.post("/console/login", data={"token": ADMIN_TOKEN, "csrf": login_form(c)})
        assert resp.status_code == 429 and "too many failed attempts" in resp.text
    metrics = httpx.get(svc.url + "/metrics").text
    assert metric(metrics, 'ens_console_logins_total{result="limited"}') >= 1
    assert metric(metrics, 'ens_console_logins_total{result="refused"}') >= session.LOGIN_MAX
    r.delete(session.ATTEMPTS + "127.0.0.1")  # the other tests log in from here too


def test_5000_open_alarms_page_in_under_a_second(svc: Service, r: redis.Redis) -> None:
    gw = svc.client(rs.add_gateway(r, "gw-many"))
    now = time.time()
    for lo in range(0, 5000, 1000):
        batch = [
            {"id": f"m{i}", "ts": now, "kind": "door", "state": "open",
             "building": f"B{i % 5}", "floor": str(i % 7), "room": f"R{i}"}
            for i in range(lo, lo + 1000)
        ]  # fmt: skip
        assert gw.post("/v1/events", json=batch).status_code == 202
    gw.close()
    wait_for(lambda: r.hlen(als.ALARMS) >= 5000, 60, "5,000 alarms")
    c, _csrf = logged_in(svc)
    with closing(c):
        best, listing = float("inf"), float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            resp = c.get("/console/alarms", params={"page": 7})
            best = min(best, time.perf_counter() - t0)
            assert resp.status_code == 200
            took = re.search(r'data-took-ms="([0-9.]+)"', resp.text)
            assert took is not None
            listing = min(listing, float(took.group(1)))
        assert re.search(r"page 7 of 5[01]\b", resp.text)  # (+ the other tests' alarms)
        assert resp.text.count("data-alarm=") == 100
    # docs/console.md: `pytest tests/test_console.py -k 5000 -s` prints the figures
    print(f"\n5,000 alarms, page 7: {best * 1000:.0f} ms a request, {listing:.0f} ms listing")
    assert best < 1.0, f"{best:.3f} s"


def test_no_console(tmp_path: Path) -> None:
    with serving(tmp_path, "--no-console") as s:
        assert httpx.get(s.url + "/console/login").status_code == 404
        assert httpx.get(s.url + "/healthz").status_code == 200


BROKEN = """profiles:
  - id: ok-one
    expr: 'seq(d: kind = "door")'
  - id: bad-one
    expr: |
      seq(d: kind = "door" and and state = "open")
"""


def test_profile_editor_check_and_save_refuse_bad_input(svc: Service, r: redis.Redis) -> None:
    c, csrf = logged_in(svc)
    with closing(c):
        resp = c.post("/console/profiles/check", data={"text": BROKEN, "csrf": csrf})
        assert resp.status_code == 200
        assert re.search(r'data-line="6">.*line 1, column 30', resp.text, re.S), resp.text
        resp = c.post("/console/profiles/save", data={"text": BROKEN, "csrf": csrf})
        assert resp.status_code == 422 and "unexpected" in resp.text
        assert BROKEN.split("\n")[1] in resp.text  # the text is shown again
        assert rs.get_profile(r, "ok-one") is None  # nothing stored, the valid one neither
        unknown_sub = "profiles:\n  - id: ok-two\n    expr: 'seq(d: kind = \"door\")'\n    subscriber: nobody\n"
        resp = c.post("/console/profiles/save", data={"text": unknown_sub, "csrf": csrf})
        assert resp.status_code == 422 and "nobody" in resp.text
        assert rs.get_profile(r, "ok-two") is None
        good = BROKEN.split("  - id: bad-one")[0]
        resp = c.post("/console/profiles/save", data={"text": good, "csrf": csrf})
        assert resp.status_code == 200 and "profile ok-one added" in resp.text
        stored = rs.get_profile(r, "ok-one")
        assert stored is not None and stored["expr"] == 'seq(d: kind = "door")'
        page = c.get("/console/profiles")
        assert 'data-profile="ok-one"' in page.text
        # no archive in this service: the backtest says what it needs
        resp = c.post("/console/profiles/backtest", data={"text": good, "csrf": csrf, "from": "1h"})
        assert resp.status_code == 422 and "--archive on" in resp.text
        resp = c.post(
            "/console/profiles/backtest", data={"text": good, "csrf": csrf, "from": "yesterday"}
        )
        assert resp.status_code == 422 and 'data-field="from"' in resp.text


def test_dead_letter_retry_and_gateways(svc: Service, r: redis.Redis) -> None:
    from notifiers import store

    n = {"id": "n-dead-1", "profile": "door", "ts": time.time(), "events": {}}
    fields = store.dead_letter_fields(
        n, {"webhook": "http://127.0.0.1:9/x"}, 0, 1, "1-0", "refused", 5
    )
    r.xadd(store.DEADLETTER, fields)
    c, csrf = logged_in(svc)
    with closing(c):
        page = c.get("/console/deliveries")
        assert page.status_code == 200 and 'data-dead="n-dead-1"' in page.text
        entry = re.search(r'name="id" value="(\d+-\d+)"', page.text)
        assert entry
        resp = c.post("/console/dead-letters/retry", data={"id": entry.group(1), "csrf": csrf})
        assert resp.status_code == 200 and "1 dead letter(s) scheduled" in resp.text
        assert r.xlen(store.DEADLETTER) == 0 and r.zscore(
            store.RETRY, store.delivery_key("n-dead-1", 0)
        )
        resp = c.post("/console/dead-letters/retry", data={"id": entry.group(1), "csrf": csrf})
        assert resp.status_code == 404 and "no dead letter" in resp.text
        rs.add_gateway(r, "gw-page")
        rs.revoke_gateway(r, "gw-page")
        page = c.get("/console/gateways")
        assert page.status_code == 200
        row = page.text.split('data-gateway="gw-page"')[1].split("</tr>")[0]
        assert "revoked" in row and "never" in row


def test_every_console_file_is_package_data() -> None:
    """A non-editable install has the templates and the vendored files (pyproject globs)."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["adapters"]
    console = root / "adapters" / "service" / "console"
    files = [p for d in ("templates", "static") for p in (console / d).iterdir()]
    assert files
    for p in files:
        rel = p.relative_to(root / "adapters").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


def test_weekly_silence_and_a_bad_filter(svc: Service, r: redis.Redis) -> None:
    c, csrf = logged_in(svc)
    with closing(c):
        form = {"floor": "3", "kind": "weekly", "weekly": "Mon-Fri 07:00-09:00",
                "tz": "Europe/Berlin", "comment": "cleaning", "csrf": csrf}  # fmt: skip
        resp = c.post("/console/silences", data=form)
        assert resp.status_code == 200 and "created" in resp.text
        (made,) = [s for s in als.list_silences(r) if s.get("comment") == "cleaning"]
        assert made["matchers"] == ["floor=3"] and made["weekly"] == "Mon-Fri 07:00-09:00"
        assert made["tz"] == "Europe/Berlin"
        assert c.post(f"/console/silences/{made['id']}/expire", data={"csrf": csrf}).is_success
        resp = c.get("/console/alarms", params={"labels": "room=~(("})
        assert resp.status_code == 422
        assert re.search(r'id="labels-error"[^>]*>[^<]*room', resp.text), resp.text
        assert 'value="room=~(("' in resp.text


def test_coalesced_repeats_show_their_number_in_the_timeline(svc: Service, r: redis.Redis) -> None:
    """Repeats of one commit are one history entry (`repeats`, `since`): the timeline says
    `repeat ×N`, as `ens alarms history` says `repeat xN`, so every match is accounted for."""
    gw = svc.client(rs.add_gateway(r, "gw-repeats"))
    now = time.time()
    batch = [
        {"id": f"rep{i}", "ts": now, "kind": "door", "state": "open",
         "building": "RB", "floor": "1", "room": "rep-1"}
        for i in range(6)
    ]  # fmt: skip
    assert gw.post("/v1/events", json=batch).status_code == 202  # one request: one commit
    gw.close()

    def alarm() -> dict[str, object] | None:
        found = als.list_alarms(r, matchers=als.parse_matchers(["room=rep-1"]))
        return found[0] if found and found[0]["count"] == 6 else None

    rec = wait_for(alarm, 30, "the alarm with 6 matches")
    entries = als.history(r, alarm=str(rec["id"]))
    coalesced = [int(e["repeats"]) for e in entries if e.get("repeats", 1) > 1]
    assert coalesced, entries  # 5 repeats in one commit: one entry (at most a few)
    assert sum(len(als.transition_ids(e)) for e in entries) == 6
    c, _csrf = logged_in(svc)
    with closing(c):
        page = c.get(f"/console/alarms/{rec['id']}")
    assert page.status_code == 200
    shown = [int(n) for n in re.findall(r'data-repeats="(\d+)"', page.text)]
    assert sorted(shown) == sorted(coalesced)
    for k in coalesced:
        assert f"repeat ×{k}</strong>" in page.text
        assert f"{k} repeats since" in page.text
