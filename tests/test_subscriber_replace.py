"""Adding a subscriber whose id is stored (issue 40 item 4): refused unless replaced, the change
shown with webhook URLs masked, the signing secret kept unless rotated, the same definition a
no-op; `ens subscriber add`, `ens profile add FILE` and the HTTP API apply one rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
from typer.testing import CliRunner

from ens.commands.service import register
from notifiers import store
from tests.helpers_service import Service

pytestmark = pytest.mark.redis

HOOK = "https://hooks.example.org/ens?token=T0PSECRET"


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def ens(cli: typer.Typer, url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--redis-url", url])


def secret_of(url: str, sid: str) -> str | None:
    with redis.Redis.from_url(url, decode_responses=True) as r:
        sub = store.get_subscriber(r, sid)
    return None if sub is None else sub.secret


def test_cli_refuses_a_changed_subscriber_and_keeps_the_secret(
    cli: typer.Typer, redis_url: str
) -> None:
    first = ens(cli, redis_url, "subscriber", "add", "s1", "--webhook", HOOK)
    assert first.exit_code == 0, first.output
    assert "stored" in first.stdout and "shown once" in first.stdout
    secret = secret_of(redis_url, "s1")
    assert secret and secret in first.stdout

    same = ens(cli, redis_url, "subscriber", "add", "s1", "--webhook", HOOK)
    assert same.exit_code == 0 and same.stdout.strip() == "subscriber s1 unchanged"
    assert secret_of(redis_url, "s1") == secret

    more = ["subscriber", "add", "s1", "--webhook", HOOK, "--email", "ops@example.org"]
    refused = ens(cli, redis_url, *more)
    assert refused.exit_code == 2
    assert "s1 is stored with another definition (--replace replaces it)" in refused.stderr
    assert "- webhook https://hooks.example.org/ens?token=<secret>" in refused.stderr
    assert "+ email ops@example.org, webhook https://hooks.example.org/ens?token=<secret>" in (
        refused.stderr
    )
    assert "T0PSECRET" not in refused.output
    with redis.Redis.from_url(redis_url, decode_responses=True) as r:
        kept = store.get_subscriber(r, "s1")
    assert kept is not None and len(kept.channels) == 1  # nothing stored

    replaced = ens(cli, redis_url, *more, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert "subscriber s1 replaced" in replaced.stdout and "+ email ops@example.org" in (
        replaced.stdout
    )
    assert "shown once" not in replaced.stdout  # the receivers keep the secret they have
    assert secret_of(redis_url, "s1") == secret


def test_cli_rotates_the_secret_when_asked(cli: typer.Typer, redis_url: str) -> None:
    assert ens(cli, redis_url, "subscriber", "add", "s2", "--webhook", HOOK).exit_code == 0
    old = secret_of(redis_url, "s2")
    res = ens(cli, redis_url, "subscriber", "add", "s2", "--webhook", HOOK, "--rotate-secret")
    assert res.exit_code == 0, res.output
    new = secret_of(redis_url, "s2")
    assert new and new != old
    assert res.stdout.count(new) == 1 and "secret rotated" in res.stdout
    both = ens(cli, redis_url, "subscriber", "add", "s2", "--webhook", HOOK, "--rotate-secret")
    assert both.exit_code == 0 and secret_of(redis_url, "s2") not in (old, new)
    clash = ["--secret", "x", "--rotate-secret"]
    assert ens(cli, redis_url, "subscriber", "add", "s2", "--webhook", HOOK, *clash).exit_code == 2


def test_profile_files_follow_the_same_rule(
    cli: typer.Typer, redis_url: str, tmp_path: Path
) -> None:
    doc = tmp_path / "p.yaml"
    doc.write_text(
        f"profiles: [{{id: p1, subscriber: ops, expr: 'kind = \"x\"'}}]\n"
        f"subscribers: [{{id: ops, channels: [{{webhook: '{HOOK}'}}]}}]\n"
    )
    assert ens(cli, redis_url, "profile", "add", str(doc)).exit_code == 0
    secret = secret_of(redis_url, "ops")
    res = ens(cli, redis_url, "profile", "add", str(doc))
    assert res.exit_code == 0 and "subscriber ops unchanged" in res.stdout
    doc.write_text(doc.read_text().replace(f"webhook: '{HOOK}'", "email: a@example.org"))
    res = ens(cli, redis_url, "profile", "add", str(doc))
    assert res.exit_code == 2 and "- webhook https://hooks.example.org/ens?token=<secret>" in (
        res.stderr
    )
    res = ens(cli, redis_url, "profile", "add", str(doc), "--replace")
    assert res.exit_code == 0 and "subscriber ops replaced" in res.stdout
    assert secret_of(redis_url, "ops") == secret


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from tests.helpers_service import redis_server

    d = tmp_path_factory.mktemp("svc-subs")
    with redis_server(d) as url:
        s = Service(url, d / "serve.log").start()
        try:
            yield s
        finally:
            s.stop()


def test_http_post_refuses_put_replaces_and_the_secret_stays(svc: Service) -> None:
    body = {"id": "h1", "channels": [{"webhook": HOOK}]}
    with svc.client(admin=True) as admin:
        created = admin.post("/v1/subscribers", json=body)
        assert created.status_code == 201 and created.json()["status"] == "created"
        secret = created.json()["secret"]
        again = admin.post("/v1/subscribers", json=body)
        assert again.status_code == 200 and again.json()["status"] == "unchanged"
        assert "secret" not in again.json()
        more = {"id": "h1", "channels": [{"webhook": HOOK}, {"email": "ops@example.org"}]}
        conflict = admin.post("/v1/subscribers", json=more)
        assert conflict.status_code == 409, conflict.text
        out = conflict.json()
        assert "PUT /v1/subscribers/h1" in out["error"] and "T0PSECRET" not in conflict.text
        assert out["changes"][1].endswith("email ops@example.org")
        put = admin.put("/v1/subscribers/h1", json=more)
        assert put.status_code == 200 and put.json()["status"] == "replaced"
        assert "secret" not in put.json()
        assert admin.put("/v1/subscribers/h2", json=more).status_code == 422  # ids differ
        rotated = admin.post("/v1/subscribers?rotate_secret=true", json=more)
        assert rotated.status_code == 200 and rotated.json()["status"] == "rotated"
        assert rotated.json()["secret"] not in (secret, None)
    with redis.Redis.from_url(svc.redis_url or "", decode_responses=True) as r:
        sub = store.get_subscriber(r, "h1")
    assert sub is not None and sub.secret == rotated.json()["secret"]


def test_profiles_and_gateways_follow_one_rule_through_cli_and_http(
    cli: typer.Typer, svc: Service
) -> None:
    """`adapters.service.admin` (issue 39 item 1): the same definition again changes nothing,
    another one is shown as - stored / + sent (the CLI refuses it without --replace, POST
    replaces); a gateway name taken is refused by both."""
    url = svc.redis_url or ""
    assert ens(cli, url, "profile", "add", "--id", "ap", "--expr", "k = 1").exit_code == 0
    same = ens(cli, url, "profile", "add", "--id", "ap", "--expr", "k  =  1")
    assert same.exit_code == 0 and "profile ap unchanged" in same.stdout
    refused = ens(cli, url, "profile", "add", "--id", "ap", "--expr", "k = 2")
    assert refused.exit_code == 2 and "+ expr: k = 2" in refused.stderr
    with svc.client(admin=True) as admin:
        again = admin.post("/v1/profiles", json={"id": "ap", "expr": "k = 1"})
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "unchanged" and again.json()["changes"] == []
        changed = admin.post("/v1/profiles", json={"id": "ap", "expr": "k = 2"})
        assert changed.status_code == 200 and changed.json()["status"] == "replaced"
        assert changed.json()["changes"] == ["- expr: k = 1", "+ expr: k = 2"]
        assert "no subscriber" in " ".join(changed.json()["warnings"])  # the CLI's warning
        assert admin.post("/v1/gateways", json={"name": "g1"}).status_code == 201
        taken = admin.post("/v1/gateways", json={"name": "g1"})
        assert taken.status_code == 409
    cli_taken = ens(cli, url, "gateway", "add", "g1")
    assert cli_taken.exit_code == 2 and taken.json()["error"] in cli_taken.stderr
    assert "no gateway 'nope'" in ens(cli, url, "gateway", "revoke", "nope").stderr
