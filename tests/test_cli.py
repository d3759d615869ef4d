"""The command line: exit status 2 and a clear message for user errors, no partial output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ens.cli import app

runner = CliRunner()
EXAMPLES = Path(__file__).parents[1] / "examples" / "quickstart"


def test_replay_example_writes_notifications(tmp_path: Path) -> None:
    out = tmp_path / "n.jsonl"
    r = runner.invoke(
        app,
        [
            "replay",
            str(EXAMPLES / "profiles.yaml"),
            str(EXAMPLES / "events.jsonl"),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.stderr
    notes = [json.loads(x) for x in out.read_text().splitlines()]
    assert {
        "profile": "break-in",
        "ts": 1709331000.0,
        "events": {"w": "w1", "p": "p1"},
        "partition": {"room": "101"},
    } in notes


def test_check_prints_every_problem(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(
        "profiles:\n"
        "  - {id: a, expr: 'k = '}\n"
        "  - {id: b, expr: 'seq(x: k = 1, y: k = 2) select each'}\n"
        "  - {id: c, expr: 'k = 3'}\n"
    )
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 2
    assert "profile 'a'" in r.stderr and "profile 'b'" in r.stderr and "within" in r.stderr
    # each problem names where (line and column in the expression, line in the file) and what was expected
    assert (
        "profile 'a': line 1, column 3 (file line 2): unexpected end of profile; expected"
        in r.stderr
    )
    assert "(file line 3)" in r.stderr
    assert "2 problem(s) (2 in 2 profile(s)); 1 of 3 profile(s) valid" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_ok() -> None:
    r = runner.invoke(app, ["check", str(EXAMPLES / "profiles.yaml")])
    assert r.exit_code == 0 and "4 profiles OK" in r.stdout


def test_bad_event_lines_are_named_and_nothing_is_written(tmp_path: Path) -> None:
    ev = tmp_path / "e.jsonl"
    ev.write_text('{"ts": 1, "k": "A"}\n{"ts": "yesterday"}\nnot json\n{"k": "A"}\n')
    out = tmp_path / "out.jsonl"
    r = runner.invoke(app, ["replay", str(EXAMPLES / "profiles.yaml"), str(ev), "--out", str(out)])
    assert r.exit_code == 2
    for needle in (
        f"{ev}, line 2: ts 'yesterday' is not an RFC 3339",
        f"{ev}, line 3, column 1: invalid JSON",
        f"{ev}, line 4: missing required key 'ts'",
    ):
        assert needle in r.stderr
    assert not out.exists()


def test_a_broken_json_line_is_located_by_file_line_and_column(tmp_path: Path) -> None:
    ev = tmp_path / "e.jsonl"
    ev.write_text('{"ts": 1, "k": "A"}\n\t{"ts": 2, "k": }\n{"ts": 3, "é": "ü",, }\n')
    for cmd in (
        ["replay", str(EXAMPLES / "profiles.yaml"), str(ev)],
        ["explain", str(EXAMPLES / "profiles.yaml"), str(ev), "-p", "x"],
    ):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2
        assert (
            f"error: {ev}, line 2, column 17: invalid JSON: Expecting value\n" in r.stderr
        )  # the tab is column 1
        assert f"error: {ev}, line 3, column 20: invalid JSON: Expecting property name" in r.stderr


def test_missing_file_and_bad_until(tmp_path: Path) -> None:
    r = runner.invoke(app, ["replay", str(tmp_path / "nope.yaml"), "-"])
    assert r.exit_code == 2 and "nope.yaml" in r.stderr
    r = runner.invoke(
        app,
        [
            "replay",
            str(EXAMPLES / "profiles.yaml"),
            str(EXAMPLES / "events.jsonl"),
            "--until",
            "soon",
        ],
    )
    assert r.exit_code == 2 and "--until" in r.stderr


def test_until_accepts_rfc3339_and_fires_timers() -> None:
    r = runner.invoke(
        app,
        [
            "replay",
            str(EXAMPLES / "profiles.yaml"),
            str(EXAMPLES / "events.jsonl"),
            "--until",
            "2024-03-02T01:00:00Z",
        ],
    )
    assert r.exit_code == 0
    silent = [json.loads(x) for x in r.stdout.splitlines() if '"silent-sensor"' in x]
    # every sensor falls silent before 01:00; h-lab twice (h2 at 23:00 re-armed it after 22:35)
    got = sorted((n["partition"]["sensor"], n["ts"]) for n in silent)
    assert [s for s, _ in got] == ["h-lab", "h-lab", "p-101", "t-101", "t-lab", "w-101"]


def test_replay_reads_stdin() -> None:
    text = (EXAMPLES / "events.jsonl").read_text()
    r = runner.invoke(app, ["replay", str(EXAMPLES / "profiles.yaml"), "-"], input=text)
    assert r.exit_code == 0 and '"break-in"' in r.stdout


def test_explain_tells_the_story() -> None:
    r = runner.invoke(
        app,
        [
            "explain",
            str(EXAMPLES / "profiles.yaml"),
            str(EXAMPLES / "events.jsonl"),
            "--profile",
            "break-in",
        ],
    )
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "w1 @ 2024-03-01 22:01:00" in out and "opened    {w: w1}" in out
    assert "reported  {w: w1, p: p1} at 2024-03-01 22:10:00.000Z (ts=1709331000)" in out
    assert "1 notification(s)" in out


def test_explain_shows_expiry_kill_and_duplicates(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        'profiles:\n  - {id: nb, expr: \'seq(a: k = "A", not x: k = "X", b: k = "B") within 10s\'}\n'
    )
    ev = tmp_path / "e.jsonl"
    ev.write_text(
        "".join(
            json.dumps(e) + "\n"
            for e in [
                {"id": "a1", "ts": 0, "k": "A"},
                {"id": "a2", "ts": 1, "k": "A"},
                {"id": "x1", "ts": 2, "k": "X"},
                {"id": "a3", "ts": 3, "k": "A"},
                {"id": "b0", "ts": 30, "k": "B"},
            ]
        )
    )
    r = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "nb"])
    out = r.stdout
    assert "ignored   a2: a partial match already exists" in out
    assert "killed    {a: a1} (killed by x = x1)" in out
    # the window of a3 (ts=3, 10s) ended at ts=13, long before b0 moved time on to ts=30
    assert "    expired   {a: a3} (window ended at ts=13)\n" in out
    assert "0 notification(s)" in out


def test_explain_expiry_of_a_nested_window_names_its_end(tmp_path: Path) -> None:
    """Under `select each` a nested window ending drops the match: its own end is shown."""
    prof = tmp_path / "p.yaml"
    prof.write_text(
        'profiles:\n  - {id: n, expr: \'seq(seq(a: k = "A", b: k = "B") within 5s, '
        'c: k = "C") within 60s select each\'}\n'
    )
    ev = tmp_path / "e.jsonl"
    ev.write_text('{"id": "a1", "ts": 0.25, "k": "A"}\n{"id": "z1", "ts": 20, "k": "Z"}\n')
    r = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "n"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-3:-1] == [
        "  time passes to 1970-01-01 00:00:20.000Z (ts=20)",
        "    expired   {a: a1} (window ended at ts=5.25)",
    ]


def test_unknown_engine_and_variant() -> None:
    args = ["replay", str(EXAMPLES / "profiles.yaml"), str(EXAMPLES / "events.jsonl")]
    r = runner.invoke(app, [*args, "--engine", "fast"])
    assert r.exit_code == 2 and "unknown engine" in r.stderr
    r = runner.invoke(app, [*args, "--variant", "magic"])
    assert r.exit_code == 2 and "unknown variant" in r.stderr


def test_explain_shows_extended_duplicates_and_consumed(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "profiles:\n"
        '  - {id: fu, expr: \'seq(a: k = "A", b: k = "B", c: k = "C") within 10s\'}\n'
        '  - {id: eu, expr: \'seq(a: k = "A", b: k = "B", c: k = "C") within 10s select each\'}\n'
    )
    ev = tmp_path / "e.jsonl"
    ev.write_text(
        "".join(
            json.dumps({"id": i, "ts": t, "k": i[0].upper()}) + "\n"
            for i, t in [
                ("a1", 0),
                ("a2", 1),
                ("b1", 2),
                ("b2", 3),
                ("c1", 4),
            ]
        )
    )
    out = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "fu"]).stdout
    assert "extended  {a: a1} -> {a: a1, b: b1}" in out
    # b2 never reaches the profile (the pool no longer awaits b): explain still says why
    assert "ignored   b2 as a duplicate of b for {a: a1, b: b1}" in out
    assert "reported  {a: a1, b: b1, c: c1}" in out
    out = runner.invoke(app, ["explain", str(prof), str(ev), "-p", "eu"]).stdout
    assert "extended  {a: a2} -> {a: a2, b: b2} (branch)" in out
    assert "consumed  {a: a1, b: b2}" in out and "consumed  {a: a2, b: b1}" in out
    assert "consumed  {a: a2, b: b2}" not in out  # holds no event of the reported match
    assert "reported  {a: a1, b: b1, c: c1}" in out


def test_python_dash_m_ens_runs_the_cli() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "ens", "check", str(EXAMPLES / "profiles.yaml")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=60,
    )
    assert r.returncode == 0 and "4 profiles OK" in r.stdout, r.stderr


def test_readme_explain_example_is_the_real_output() -> None:
    """The README's `ens explain` walkthrough shows exactly what the command prints."""
    root = Path(__file__).parents[1]
    ex = root / "examples" / "explain"
    r = runner.invoke(
        app, ["explain", str(ex / "fire.yaml"), str(ex / "fire.jsonl"), "--profile", "fire"]
    )
    assert r.exit_code == 0, r.stderr
    readme = (root / "README.md").read_text()
    shown = readme.split("examples/explain/fire.jsonl --profile fire\n", 1)[1].split("```", 1)[0]
    assert r.stdout == shown
    for action in ("opened", "ignored", "extended", "reported", "killed", "expired"):
        assert f"    {action} " in shown


def test_unreadable_inputs_and_unwritable_out_are_user_errors(tmp_path: Path) -> None:
    """Directories, non-UTF-8 files, corrupt .gz, a bad --out or --tz: exit 2, a message, no traceback."""
    prof, evs = str(EXAMPLES / "profiles.yaml"), str(EXAMPLES / "events.jsonl")
    binary = tmp_path / "binary"
    binary.write_bytes(b'{"ts": 1, "k": "\xff\xfe"}\n')
    badgz = tmp_path / "e.jsonl.gz"
    badgz.write_bytes(b"not gzip")
    cases = [
        (["replay", prof, str(tmp_path)], "is a directory"),
        (["replay", prof, str(binary)], "not UTF-8"),
        (["replay", str(binary), evs], "not UTF-8"),
        (["check", str(binary)], "not UTF-8"),
        (["replay", prof, str(badgz)], "cannot read event file"),
        (["explain", prof, str(binary), "-p", "hot"], "not UTF-8"),
        (["replay", prof, evs, "--out", str(tmp_path)], "is a directory"),
        (
            ["replay", prof, evs, "--out", str(tmp_path / "no" / "such" / "dir.jsonl")],
            "cannot write --out",
        ),
        (["replay", prof, evs, "--tz", "Mars/Olympus"], "unknown time zone"),
        (["explain", prof, evs, "-p", "hot", "--tz", "Nope"], "unknown time zone"),
    ]
    for args, needle in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.stderr, (args, r.stderr)
        assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output, (
            args,
            r.exception,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "binary",
        "e.jsonl.gz",
    ]  # no temp file left


def test_check_names_every_bad_subscriber_channel_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "subs.yaml"
    f.write_text(
        "profiles:\n  - {id: p1, expr: 'kind = \"a\"', subscriber: ok}\n"
        "subscribers:\n"
        "  - id: ops\n    channels:\n      - email: not-an-address\n      - webhook: ftp://x\n"
        "      - sms: 123\n      - email: a b@c\n      - webhook: https://x\n        colour: red\n"
        "  - {id: ok, channels: [{email: a@b.c}]}\n"
    )
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 2
    assert (
        "file line 6: subscriber 'ops': channels.0.email: 'not-an-address' is not an e-mail address"
    ) in r.stderr
    assert (
        "file line 7: subscriber 'ops': channels.1.webhook: 'ftp://x' is not an http(s) URL"
        in r.stderr
    )
    assert "file line 8: subscriber 'ops': channels.2: a channel is" in r.stderr
    # what storing rejects too: a space in an address, a key no channel has (at its own line)
    assert (
        "file line 9: subscriber 'ops': channels.3.email: 'a b@c' is not an e-mail address"
        in r.stderr
    )
    assert (
        f"{f}:11:9: subscriber 'ops': channels.4.colour: unknown key (allowed: webhook, secret, format)"
        in r.stderr
    )
    # the profile of the good subscriber stays
    assert "5 problem(s) (5 in subscribers); 1 of 1 profile(s) valid" in r.stderr


def test_check_counts_problems_and_profiles_that_add_up(tmp_path: Path) -> None:
    """A profile naming an unknown subscriber is not counted valid; the parts add up."""
    f = tmp_path / "one.yaml"
    f.write_text(
        "profiles:\n  - {id: h2, expr: 'kind = \"a\"', subscriber: nobody}\n"
        "  - {id: h3, expr: 'kind = '}\n  - {id: h4, expr: 'kind = \"b\"'}\n"
        "subscribers:\n  - {id: ops, channels: [{email: a@b.c}]}\n"
        "  - {id: bad, channels: [{email: nope}]}\nextra: 1\n"
    )
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 2
    assert r.stderr.count("error: ") == 4
    assert (
        f"{f}: 4 problem(s) (2 in 2 profile(s), 1 in subscribers, 1 elsewhere); "
        "1 of 3 profile(s) valid"
    ) in r.stderr


def test_misspelled_keys_are_rejected_at_their_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "typo.yaml"
    f.write_text(
        "profiles:\n  - id: p1\n    expr: 'kind = \"a\"'\n    subscriber: ops\n"
        "  - {id: p2, exp: 'kind = \"b\"'}\n"
        "subscribers:\n  - id: ops\n    chanels:\n      - email: a@b.c\n"
        "profile: x\n"
    )
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 2
    assert (
        f"error: {f}:8:5: subscriber 'ops': chanels: unknown key (allowed: id, channels, "
        "digest, secret, templates)"
    ) in r.stderr  # it stored a subscriber without channels
    assert (
        f"error: {f}:5:14: profile 'p2': unknown key 'exp' (allowed: id, expr, subscriber, "
        "description, alarm)"
    ) in r.stderr
    assert f"error: {f}:10:1: unknown top-level key 'profile'" in r.stderr
    for example in sorted(EXAMPLES.parent.glob("*/*.yaml")):  # the shipped files still pass
        text = "\n" + example.read_text()
        routing = "\nroute:" in text  # a routing file (docs/routing.md)
        command = ["route", "check"] if routing else ["check"]
        if "\nassets:" in text:  # an asset registry (docs/assets.md)
            command = ["assets", "check"]
        assert runner.invoke(app, [*command, str(example)]).exit_code == 0, example


def test_check_warns_about_a_file_without_profiles(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("profiles: []\n")
    r = runner.invoke(app, ["check", str(empty)])
    assert r.exit_code == 0 and "defines no profiles" in r.stderr


def test_bench_arguments_are_checked_before_measuring(tmp_path: Path) -> None:
    for args, needle in [
        (["bench", "pool", "--sizes", "abc"], "--sizes"),
        (["bench", "pool", "--sizes", "0"], "at least 1"),
        (["bench", "pool", "--events", "0"], "--events"),
        (["bench", "paper", "--replot", "--out", str(tmp_path)], "paper.csv"),
        (["bench", "composite", "--variants", "references,fast"], "unknown variant 'fast'"),
        (["bench", "engines", "--repeat", "2", "--hash-seeds", "3"], "between 1 and --repeat"),
        (["bench", "engines", "--only", "no such cell"], "no cell matches"),
    ]:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        flat = re.sub(r"[\s│╭╮╰╯─]", "", r.output)  # rich draws the message in a wrapped box
        assert needle.replace(" ", "") in flat, (args, r.output)
        assert "Traceback" not in r.output


def test_spark_checks_the_data_set_name_before_starting_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    import adapters.spark.session as session

    def no_jvm(*_a: object, **_k: object) -> None:
        raise AssertionError("Spark was started before the arguments were checked")

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(session, "get_spark", no_jvm)
    feed = tmp_path / "feed"
    feed.mkdir()
    for cmd in (
        ["replay", str(feed), "--out", str(tmp_path / "o.jsonl")],
        ["stats", str(feed), "--out", str(tmp_path / "s.json")],
    ):
        r = runner.invoke(
            app,
            ["spark", *cmd, "--profiles", str(EXAMPLES / "profiles.yaml"), "--dataset", "ketti"],
        )
        assert r.exit_code == 2, r.output
        assert "error: unknown data set 'ketti' (known: keti" in r.stderr
        r = runner.invoke(
            app, ["spark", *cmd, "--profiles", str(EXAMPLES / "profiles.yaml"), "--rooms", "101"]
        )
        assert r.exit_code == 2 and "--rooms applies to --dataset only" in r.stderr, r.output


# ---- issue 17 item 16: ENS_URL, --version, help metavars


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"ens {version('ens')}"


def _all_commands() -> list[list[str]]:
    """Every command path of the CLI, groups included (`[]` is `ens` itself)."""
    import click
    import typer.main

    paths: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_help_shows_no_python_type_metavars() -> None:
    """Help read `--deliver <bool>`, `--role <list[str]>`, `--port <int>`: Python types, not a
    command line's words. Switches show none, options name their value (`--role ROLE`)."""
    bad = {}
    for path in _all_commands():
        r = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        found = set(re.findall(r"<[a-z][a-z_\[\], |]*>", r.stdout))
        if found:
            bad[" ".join(path) or "ens"] = sorted(found)
    assert not bad, bad
    serve = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["serve", "--help"]).stdout
    assert re.search(r"--role\s+ROLE\b", serve) and re.search(r"--port\s+PORT\b", serve)
    assert re.search(r"--deliver\s+--no-deliver\s+Also run", serve)


def test_post_sends_to_the_ens_url_from_the_environment(tmp_path: Path) -> None:
    """`ens post` without --url goes to $ENS_URL (a real process, a real server on loopback)."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    paths: list[str] = []

    class Ingest(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            n = len(self.rfile.read(int(self.headers["Content-Length"])).splitlines())
            paths.append(self.path)
            data = json.dumps({"accepted": n, "rejected": 0, "errors": []}).encode()
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ev = tmp_path / "e.jsonl"
    ev.write_text("".join(json.dumps({"id": f"e{i}", "ts": i}) + "\n" for i in range(3)))
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ENS_")}
    env.update(
        ENS_URL=f"http://127.0.0.1:{httpd.server_address[1]}/",
        ENS_API_KEY="k",
        NO_PROXY="127.0.0.1",
        no_proxy="127.0.0.1",
    )
    try:
        r = subprocess.run(
            [sys.executable, "-m", "ens", "post", str(ev)],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parents[1],
            env=env,
            timeout=60,
        )
    finally:
        httpd.shutdown()
    assert r.returncode == 0, r.stderr
    assert paths == ["/v1/events"] and "3 accepted, 0 rejected" in r.stdout


# ---- issue 17 item 14: start-up time, one YAML parse, replay progress


def test_the_cli_starts_without_importing_the_heavy_libraries() -> None:
    """`ens --help` and `ens check` took 1.1 s, mostly importing redis (with asyncio),
    pydantic and the service for commands that were not run."""
    import subprocess
    import sys

    code = (
        "import sys, ens.cli; print(' '.join(m for m in ('redis', 'fastapi', 'pyspark', "
        "'pandas', 'matplotlib', 'pydantic', 'uvicorn', 'httpx', 'lark', 'rich.console') "
        "if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [], f"imported at start: {r.stdout}"


def test_a_profile_file_is_parsed_once_by_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file was read twice (compose for positions, safe_load for data) by the pure Python
    loader although libyaml's is installed; positions still come out of the one parse."""
    import yaml

    from profiles import profile_file

    def twice(*args: object, **kw: object) -> None:
        raise AssertionError("a second, pure Python parse")

    monkeypatch.setattr(yaml, "compose", twice)
    monkeypatch.setattr(yaml, "safe_load", twice)
    if yaml.__with_libyaml__:
        monkeypatch.setattr(yaml, "SafeLoader", twice)  # the C loader does not need it
    text = "profiles:\n  - {id: a, expr: 'k = 1'}\n  - id: b\n    exprr: 'k = 2'\n"
    pset, errors = profile_file.parse_profile_document(text, "p.yaml")
    assert [p.id for p in pset.profiles] == ["a"]
    assert [str(e) for e in errors] == [
        "p.yaml:4:5: profile 'b': unknown key 'exprr' (allowed: id, expr, subscriber, description, alarm)"
    ]


def _replay_stderr(tmp_path: Path, tty: bool) -> str:
    """stderr of `ens replay` on a ~1.5 MB event file, attached to a terminal or a pipe."""
    import os
    import pty
    import subprocess
    import sys

    events = tmp_path / "big.jsonl"
    with events.open("w") as fh:
        for i in range(20000):
            fh.write(
                json.dumps(
                    {
                        "id": f"e{i}",
                        "ts": 1709330000 + i,
                        "kind": "temperature",
                        "room": f"r{i % 50}",
                        "sensor": f"s{i % 50}",
                        "value": 20 + i % 7,
                    }
                )
                + "\n"
            )
    cmd = [
        sys.executable,
        "-m",
        "ens",
        "replay",
        str(EXAMPLES / "profiles.yaml"),
        str(events),
        "--out",
        str(tmp_path / "n.jsonl"),
    ]
    root = Path(__file__).parents[1]
    if not tty:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stderr
    main, side = pty.openpty()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=side,
        cwd=root,
        env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
    )
    os.close(side)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_replay_of_a_large_file_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    shown = _replay_stderr(tmp_path, tty=True)
    assert "reading events" in shown and "replaying" in shown, shown[-500:]
    piped = _replay_stderr(tmp_path, tty=False)  # pipes and files get no bar (warnings only)
    assert [line for line in piped.splitlines() if not line.startswith("warning: ")] == []


def test_replay_freezes_the_loaded_profiles_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17 item 15: the engine (profiles, pool) and the events are long-lived; kept out of
    gc's scans while the replay runs, and given back afterwards (the CLI may run in-process)."""
    import gc

    import ens.replay

    seen: list[int] = []
    real = ens.replay.replay

    def spy(*args: object, **kw: object):  # noqa: ANN202
        seen.append(gc.get_freeze_count())
        return real(*args, **kw)

    monkeypatch.setattr(ens.replay, "replay", spy)
    gc.unfreeze()
    r = runner.invoke(
        app, ["replay", str(EXAMPLES / "profiles.yaml"), str(EXAMPLES / "events.jsonl")]
    )
    assert r.exit_code == 0, r.stderr
    assert seen and seen[0] > 0 and gc.get_freeze_count() == 0


def test_replay_and_check_warn_about_profiles_that_will_not_fire(tmp_path: Path) -> None:
    """Warnings, not errors: the notifications are written as before."""
    f = tmp_path / "p.yaml"
    f.write_text(
        "profiles:\n  - {id: typo, expr: 'knd = \"window\"'}\n"
        "  - {id: inf, expr: 'value > 1e400'}\n  - {id: ok, expr: 'kind = \"window\"'}\n"
    )
    ev = tmp_path / "e.jsonl"
    ev.write_text('{"id": "w1", "ts": 1, "kind": "window", "value": 3}\n')
    r = runner.invoke(app, ["replay", str(f), str(ev)])
    assert r.exit_code == 0, r.output
    assert '"profile": "ok"' in r.stdout and r.stdout.count("\n") == 1
    assert (
        "warning: profile 'typo': no event seen so far has attribute 'knd' (did you mean 'kind'?)"
    ) in r.stderr
    assert "warning: profile 'inf': a number is beyond the float range" in r.stderr
    assert "'ok'" not in r.stderr
    r = runner.invoke(app, ["check", str(f)])
    assert r.exit_code == 0 and "3 profiles OK" in r.stdout
    assert "profile 'inf': a number is beyond" in r.stderr and "knd" not in r.stderr


def test_generate_draws_no_progress_bar_into_a_pipe(tmp_path: Path) -> None:
    out = tmp_path / "f.jsonl"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ens",
            "generate",
            "facility",
            "-b",
            "1",
            "-r",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0
    assert "events ->" not in r.stderr and "━" not in r.stderr, r.stderr


def test_bench_lazy_outside_the_checkout_checks_inputs_first_and_finds_its_defaults(
    tmp_path: Path,
) -> None:
    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ens", "bench", "lazy", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        )

    r = bench("--profiles", "missing.yaml", "--repeat", "1")
    assert r.returncode == 2, r.stderr
    assert "profile file missing.yaml not found" in r.stderr and "events/s" not in r.stdout
    r = bench("--ratios", "", "--keti-limit", "300", "--repeat", "1")  # the shipped defaults
    assert r.returncode == 0, r.stderr
    assert "KETI" in r.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_paper_bench_stamps_every_notification_of_both_engines() -> None:
    import random

    from bench import paper

    rng = random.Random(1)
    values = paper.sample_values(50, rng)
    profiles = paper.profiles_for(values, "unique pairs")
    events = paper.stream(rng.sample(values, 50), 5, rng)
    makers = paper.engines()
    assert {"single-step:dynamic", "two-step"} <= set(makers)
    for make in makers.values():
        r = paper.measure(make, profiles, events)
        assert r["notifications"] == 50 and r["composite_response_us"] > 0


def test_engines_bench_reports_the_median_of_each_repeats_own_ratio(tmp_path: Path) -> None:
    """`ens bench engines`: a cell's ratio is the median over repeats of baseline / single-step
    within a repeat (both runs back to back in one worker), not a ratio of two medians; the
    notification counts agree and the table lands between its markers."""
    import statistics

    from bench import engines

    md = tmp_path / "b.md"
    md.write_text("# B\n\nkept\n")
    [row] = engines.run(3, True, 0, "paper order 1 groups", "", str(md), "", hash_seeds=1)
    pairs = row["runs"]
    assert len(pairs) == 3 and all(s > 0 and b > 0 for s, b in pairs)
    assert row["ratio"] == statistics.median(b / s for s, b in pairs)
    assert row["ss_us"] == statistics.median(s for s, _ in pairs)
    assert "mismatch" not in row and row["notes"] > 0
    text = md.read_text()
    assert text.startswith("# B\n\nkept\n") and "| paper order 1 groups |" in text
