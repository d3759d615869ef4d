"""The README's walkthrough, run as written: its shell lines in one bash, its receiver.py.

Only what cannot be literal is changed: free ports for 8080 and 9000, a temporary
ENS_DATA_DIR, the webhook secret taken from `ens subscriber add`'s output (the README
shows one run's), and waits where the README says "later". The outputs the README shows
are checked where they do not vary between runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_service import ROOT, free_port

README = ROOT / "README.md"
BIN = os.path.dirname(sys.executable)  # the venv's bin: its `ens` console script and `python`


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _shell_lines(section: str) -> list[str]:
    """The `$ ` commands of the section's code blocks, continuation lines joined."""
    lines: list[str] = []
    in_block = False
    pending = ""
    for raw in section.splitlines():
        if raw.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        if pending:
            pending += "\n" + raw
        elif raw.startswith("$ "):
            pending = raw[2:]
        else:
            continue
        if not pending.endswith("\\"):
            lines.append(pending)
            pending = ""
    return lines


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough uses curl")
def test_the_readme_walkthrough_works_as_written(tmp_path: Path) -> None:
    section = _section(README.read_text(), "Walkthrough")
    receiver = re.search(r'```python\n("""receiver\.py.*?)```', section, re.S)
    assert receiver, "README: receiver.py block not found"
    api, hook = free_port(), free_port()
    assert '("127.0.0.1", 9000)' in receiver.group(1)
    (tmp_path / "receiver.py").write_text(receiver.group(1).replace("9000", str(hook)))
    wait_http = (
        "for i in $(seq 200); do curl -s -o /dev/null {url} && break; sleep 0.1; done; "
        "curl -s -o /dev/null {url}"
    )
    # whatever happens, the service and the receiver go with the script
    script = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT", f"cd {ROOT}"]
    commands = _shell_lines(section)
    assert commands[0] == ". .venv/bin/activate", commands[0]
    for cmd in commands:
        cmd = cmd.replace("8080", str(api)).replace("9000", str(hook))
        cmd = cmd.replace("/tmp/ens-walkthrough", str(tmp_path / "ens-data"))
        if cmd.startswith(". .venv/bin/activate") and not (ROOT / ".venv").exists():
            continue  # a suite run outside `make test`: ens and python come from BIN (below)
        if cmd.startswith("ens serve"):
            script.append(cmd.replace("&", f"> {tmp_path}/serve.log 2>&1 &"))
            script.append(wait_http.format(url=f"http://127.0.0.1:{api}/healthz"))
        elif cmd.startswith("ens subscriber add"):
            script.append(f"{cmd} | tee {tmp_path}/subscriber.out")
        elif cmd.startswith("SECRET="):
            run = re.sub(
                r"^SECRET=\S+ python receiver\.py &$",
                f"SECRET=$(sed -n 's/.*shown once): //p' {tmp_path}/subscriber.out) "
                f"python {tmp_path}/receiver.py > {tmp_path}/receiver.log 2>&1 &",
                cmd,
            )
            assert run != cmd, cmd
            script.append(run)
            script.append(
                f"for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/{hook}) 2>/dev/null "
                "&& break; sleep 0.1; done"
            )
        elif cmd.startswith("ens notifications tail"):
            # "about two seconds later": the receiver has the notification before the outbox is read
            script.append(
                f"for i in $(seq 300); do grep -q verified: {tmp_path}/receiver.log && break; "
                "sleep 0.1; done"
            )
            script.append(cmd)
        else:
            script.append(cmd)
    script.append("kill %1 %2")  # the README's Ctrl-C / `kill %1`
    (tmp_path / "walkthrough.sh").write_text("\n".join(script) + "\n")
    # `ens` and `python` are the ones next to the interpreter running the suite, whatever PATH holds
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    res = subprocess.run(
        ["bash", str(tmp_path / "walkthrough.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = res.stdout
    log = (tmp_path / "receiver.log").read_text() if (tmp_path / "receiver.log").exists() else ""
    context = f"stdout:\n{out}\nstderr:\n{res.stderr}\nreceiver:\n{log}"
    assert res.returncode == 0, context
    assert "subscriber facilities stored" in out, context
    assert "profile break-in added" in out, context
    assert re.search(r"^lobby\.\S+$", out, re.M), context  # echo $KEY
    assert out.count('{"accepted":1,"rejected":0,"errors":[]}') == 2, context
    verified = [ln for ln in log.splitlines() if ln.startswith("verified:")]
    assert len(verified) == 1 and '"profile":"break-in"' in verified[0], context
    assert '"partition":{"room":"101"}' in verified[0], context
    assert "401" in out and 'REJECTED: {"notification_id": "forged"}' in log, context
    assert re.search(r'^\{"id":"break-in:[0-9a-f]+:1","profile":"break-in"', out, re.M), context
    assert (
        '{"accepted":0,"rejected":1,"errors":[{"index":0,"id":"e3","error":"missing required key \'ts\'"}]}'
        in out
    ), context
