"""The console in a real browser (headless Debian Chromium driven by Playwright) against a real
`ens serve` on a real redis-server: log in, an alarm appears without a reload, acknowledge it,
silence a building and see the next alarm silenced, an attribute `<script>` shown as text, and
the acknowledge-only token refused the management pages. ENS_SCREENSHOTS=1 writes each page to
docs/console/ (docs/console.md shows them)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from adapters.service import alarm_store as als
from tests.helpers_browser import chromium, need_chromium, screenshot
from tests.helpers_service import ADMIN_TOKEN, Service, client_fixtures, serving, wait_for

pytestmark = pytest.mark.redis
WAIT = 15_000  # ms a page waits for what the test expects (a busy machine)
_ids = itertools.count(1)
PROFILE = {
    "id": "window-open",
    "expr": 'seq(w: kind = "window" and state = "open") per building, floor, room',
    "alarm": {
        "severity": "major",
        "clear": {"on": 'kind = "window" and state = "closed"'},
        "notify": ["raise", "ack", "clear"],
    },
}

SMOKE = {
    "id": "smoke",
    "expr": 'seq(s: kind = "smoke") per building, floor, room',
    "alarm": {"severity": "critical", "clear": "after 1h", "notify": ["raise"]},
    "subscriber": "ops",
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    need_chromium()
    d = tmp_path_factory.mktemp("console-browser")
    archive = ["--archive", str(d / "archive"), "--archive-flush", "0.5s"]
    with serving(d, "--reorder-seconds", "0.1", *archive) as s:
        with s.client(admin=True) as admin:  # deliveries are off (--no-deliver): none is sent
            hook = {"id": "ops", "channels": [{"webhook": "http://127.0.0.1:9/hook"}]}
            resp = admin.post("/v1/subscribers", json=hook)
            assert resp.status_code in (200, 201), resp.text
            resp = admin.post("/v1/profiles", json={**PROFILE, "subscriber": "ops"})
            assert resp.status_code == 201, resp.text
            resp = admin.post("/v1/profiles", json=SMOKE)
            assert resp.status_code == 201, resp.text
        yield s


r, _admin, gw = client_fixtures("gw-console")


@pytest.fixture(scope="module")
def browser(svc: Service) -> Iterator[Any]:
    with chromium() as b:
        yield b


def post(gw: httpx.Client, **attrs: Any) -> None:
    ev = {"id": f"c{next(_ids)}", "ts": time.time(), "kind": "window", "state": "open", **attrs}
    resp = gw.post("/v1/events", json=[ev])
    assert resp.status_code == 202, resp.text


def login(browser: Any, svc: Service, token: str, width: int = 1100) -> Any:
    page = browser.new_context(viewport={"width": width, "height": 800}).new_page()
    page.set_default_timeout(WAIT)
    page.goto(svc.url + "/console")
    assert page.url.endswith("/console/login")
    page.get_by_label("Token").fill(token)
    page.get_by_label("Token").press("Enter")  # by keyboard
    page.wait_for_url("**/console/alarms")
    return page


def row(page: Any, place: str, profile: str = "window-open") -> Any:
    """The alarm of a profile at building/floor/room."""
    return page.locator(f"tr[data-place='{place}']", has_text=profile)


def test_login_live_alarm_ack_and_silence(
    svc: Service, r: redis.Redis, gw: httpx.Client, browser: Any
) -> None:
    page = login(browser, svc, ADMIN_TOKEN)
    page.wait_for_selector("#alarms .summary")
    loads = []
    page.on("load", lambda _p: loads.append(1))
    post(gw, building="B1", floor="2", room="201")
    # appears without a reload: the live channel (SSE) makes htmx fetch the table
    row(page, "B1/2/201").wait_for()
    assert page.locator("h2.place", has_text="B1").is_visible()
    assert "active-unacknowledged" in row(page, "B1/2/201").inner_text()
    assert not loads, "the page was reloaded"

    row(page, "B1/2/201").get_by_role("button", name="Acknowledge").focus()
    page.keyboard.press("Enter")  # by keyboard
    page.locator(".notice", has_text="acknowledged").wait_for()
    row(page, "B1/2/201").locator("td.state", has_text="active-acknowledged").wait_for()

    row(page, "B1/2/201").get_by_role("link", name="window-open").click()
    page.wait_for_url("**/console/alarms/*")
    page.locator(".timeline li", has_text="ack").first.wait_for()
    assert page.locator(".timeline li", has_text="raise").count() == 1
    # the events of the match and `ens explain` over them, from the archive (a file / 0.5 s)
    deadline = time.monotonic() + 15
    while page.locator("pre.trace").count() == 0:
        assert time.monotonic() < deadline, page.locator("main").inner_text()
        time.sleep(0.3)
        page.reload()
    assert "room=201" in page.locator(".events").first.inner_text()
    assert "profile window-open" in page.locator("pre.trace").inner_text()
    screenshot(page, "alarm")

    page.get_by_role("link", name="Silences").click()
    page.get_by_label("Building").fill("B9")
    page.get_by_label("Hours").fill("abc")  # bad input: shown again, error at the field
    page.get_by_role("button", name="Create silence").click()
    page.locator("#s-hours-error", has_text="not a number").wait_for()
    assert page.get_by_label("Building").input_value() == "B9"
    assert page.locator("tr[data-silence]").count() == 0  # nothing stored
    page.get_by_label("Hours").fill("2")
    page.get_by_role("button", name="Create silence").click()
    page.locator(".notice", has_text="created").wait_for()
    assert "building=B9" in page.locator("tr[data-silence]").first.inner_text()
    screenshot(page, "silences")

    page.get_by_role("link", name="Alarms").click()
    page.wait_for_selector("#alarms .summary")
    post(gw, building="B9", floor="1", room="101")
    silenced = row(page, "B9/1/101").locator(".badge.silenced")
    silenced.wait_for()
    assert "B9" in page.locator("h2.place", has_text="B9").inner_text()
    post(gw, building="B1", floor="2", room="201", kind="smoke")
    wait_for(lambda: any(a["profile"] == "smoke" for a in als.list_alarms(r)), 15, "smoke alarm")
    row(page, "B1/2/201", "smoke").locator(".badge.sev-critical").wait_for()
    screenshot(page, "alarms")
    page.context.close()


def test_attribute_script_is_text(svc: Service, gw: httpx.Client, browser: Any) -> None:
    evil = "<script>document.title='pwned'</script>"
    post(gw, building="B3", floor="0", room=evil)
    page = login(browser, svc, ADMIN_TOKEN, width=390)  # a phone's width
    page.locator("h2.place", has_text="<script>").wait_for()
    assert page.title() != "pwned"
    assert "&lt;script&gt;" in page.content()
    # readable at that width: nothing wider than the screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "alarms-phone")
    page.context.close()


def test_acknowledge_only_token(svc: Service, r: redis.Redis, browser: Any) -> None:
    token = als.add_token(r, "night-shift")
    page = login(browser, svc, token)
    assert "acknowledge only" in page.locator("header").inner_text()
    assert page.get_by_role("link", name="Silences").count() == 0
    page.wait_for_selector("#alarms .summary")
    assert page.get_by_role("button", name="Clear").count() == 0
    for path in ("/console/silences", "/console/profiles", "/console/gateways",
                 "/console/deliveries", "/console/profiles/edit"):  # fmt: skip
        resp = page.goto(svc.url + path)
        assert resp is not None and resp.status == 403, path
        assert "needs the management token" in page.locator("main").inner_text()
    screenshot(page, "refused")
    page.context.close()


def test_screenshot_login_page(svc: Service, browser: Any, tmp_path: Path) -> None:
    page = browser.new_context(viewport={"width": 390, "height": 700}).new_page()  # a phone
    page.goto(svc.url + "/console/login")
    assert page.locator("#token").is_visible()
    screenshot(page, "login")
    page.context.close()


def test_profile_editor_and_backtest(svc: Service, gw: httpx.Client, browser: Any) -> None:
    post(gw, building="B5", floor="1", room="11")  # in the archive for the backtest
    page = login(browser, svc, ADMIN_TOKEN)
    page.get_by_role("link", name="Profiles").click()
    page.locator("tr[data-profile='window-open'] td.hits").wait_for()
    screenshot(page, "profiles")
    page.get_by_role("link", name="New profile").click()
    page.locator("#problems .ok").wait_for()  # the template document is valid
    editor = page.get_by_label("Profile document")
    editor.fill("")
    editor.press_sequentially(  # typed: validated as it changes (debounced)
        "profiles:\n  - id: broken\n    expr: |\n"
        '      seq(w: kind = "window" and and state = "open") per room\n',
        delay=2,
    )
    problem = page.locator("#problems li[data-line='4']")
    problem.wait_for()
    assert (
        "line 1, column 32" in problem.inner_text() and "unexpected 'state'" in problem.inner_text()
    )
    screenshot(page, "editor")
    page.get_by_role("button", name="Save").click()  # refused: nothing stored
    page.locator("#problems li[data-line='4']").wait_for()
    assert page.locator(".notice").count() == 0

    editor.fill(
        "profiles:\n  - id: bt-window\n    expr: |\n"
        '      seq(w: kind = "window" and state = "open") per building, floor, room\n'
    )
    page.locator("#problems .ok").wait_for()
    page.get_by_label("From").fill("1h")
    # the archive writes files every 0.5 s: retry until the backtest has seen the event
    deadline = time.monotonic() + 20
    while True:
        page.get_by_role("button", name="Run backtest").click()
        result = page.locator("#backtest .backtest-result, #backtest .error")
        result.wait_for()
        text = result.inner_text()
        if "bt-window" in text and " 0 events" not in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.5)
    row = page.locator("#backtest tr", has_text="bt-window").inner_text()
    assert row.split()[1] != "0", row  # matches
    screenshot(page, "backtest")
    page.context.close()


def test_gateways_and_deliveries(svc: Service, gw: httpx.Client, browser: Any) -> None:
    post(gw, building="B6", floor="1", room="12")
    page = login(browser, svc, ADMIN_TOKEN)
    page.get_by_role("link", name="Gateways").click()
    gw_row = page.locator("tr[data-gateway='gw-console']")
    assert "ago" in gw_row.inner_text() and "valid since" in gw_row.inner_text()
    screenshot(page, "gateways")
    page.get_by_role("link", name="Deliveries").click()
    page.locator("h2", has_text="Dead letters").wait_for()
    assert "window-open" in page.locator("main").inner_text()  # the outbox's alarm messages
    screenshot(page, "deliveries")
    page.context.close()
