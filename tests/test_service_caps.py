"""The caps of issue 41 item 5 end to end: `ens serve` (real redis-server, real process) logs a
WARNING naming the profile whose partial matches or notifications were capped, and /metrics
counts them per profile."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import redis

from adapters.service import redis_store as rs
from tests.helpers_service import Service, outbox_for, redis_server, wait_for

pytestmark = pytest.mark.redis

FLOOD = 'seq(a: kind = "x", b: kind = "y") within 1d select each consume shared'


def sample(text: str, name: str, profile: str) -> float:
    """One labelled sample of the Prometheus text (0 if absent)."""
    prefix = f'{name}{{profile="{profile}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def test_capped_profile_is_logged_by_name_and_counted_in_metrics(tmp_path: Path) -> None:
    with redis_server(tmp_path) as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        rs.put_profile(r, "flood", FLOOD)
        rs.put_profile(r, "quiet", 'kind = "y"')
        key = rs.add_gateway(r, "gw1")
        log = tmp_path / "serve.log"
        s = Service(
            url,
            log,
            "--reorder-seconds",
            "0.1",
            "--max-partial-matches",
            "5",
            "--max-notifications-per-event",
            "3",
        ).start()
        try:
            t0 = time.time()
            events = [{"id": f"x{i}", "ts": t0 + i * 0.01, "kind": "x"} for i in range(10)]
            events.append({"id": "y1", "ts": t0 + 0.5, "kind": "y"})
            resp = httpx.post(s.url + "/v1/events", json=events, headers={"X-API-Key": key})
            assert resp.status_code == 202, resp.text
            # 5 x kept (x5..x9), 3 of their 5 notifications kept; the other profile unharmed
            wait_for(lambda: len(outbox_for(r, "flood")) == 3, 20, "3 capped notifications")
            wait_for(lambda: len(outbox_for(r, "quiet")) == 1, 20, "the quiet profile's one")
            got = [n["events"]["a"]["id"] for n in outbox_for(r, "flood")]
            assert got == ["x5", "x6", "x7"]

            def counted() -> bool:
                text = httpx.get(s.url + "/metrics", timeout=5).text
                return (
                    sample(text, "ens_partial_matches_dropped_total", "flood") == 5
                    and sample(text, "ens_notifications_capped_total", "flood") == 2
                )

            wait_for(counted, 20, "the caps' counters in /metrics")
            warnings = [ln for ln in log.read_text().splitlines() if "hit its caps" in ln]
            # once per profile per minute: the notifications capped later are not logged again
            assert len(warnings) == 1, warnings
            assert "WARNING" in warnings[0] and "profile 'flood'" in warnings[0]
            assert "5 partial matches dropped" in warnings[0]
            assert "'quiet'" not in log.read_text()
        finally:
            s.stop()
            r.close()


def test_profile_add_warns_when_the_recent_events_make_select_each_pile_up(rb: redis.Redis) -> None:
    """The rates come from the ingest stream (real Redis): x arrived every 1.6 s, so a day's
    window holds ~54,000 partial matches; a rare kind or `select first` draws no warning."""
    from adapters.service.profile_lint import profile_warnings
    from profiles.parser import parse_profile

    events = [{"id": f"x{i}", "ts": 1000.0 + 1.6 * i, "kind": "x"} for i in range(100)]
    events.append({"id": "r1", "ts": 1100.0, "kind": "r"})
    with rb.pipeline() as p:
        for ev in events:
            p.xadd(rs.INGEST, {rs.INGEST_EVENT: json.dumps(ev), rs.INGEST_GATEWAY: "gw"})
        p.execute()
    got = profile_warnings(rb, parse_profile(FLOOD, "flood"))
    assert len(got) == 1 and "profile 'flood': `select each consume shared`" in got[0], got
    assert "about 54," in got[0]
    assert profile_warnings(rb, parse_profile(FLOOD.replace('"x"', '"r"'), "rare")) == []
    first = FLOOD.replace("select each consume shared", "")
    assert profile_warnings(rb, parse_profile(first, "first")) == []
