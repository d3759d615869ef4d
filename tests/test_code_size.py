"""No function over 80 lines and no class over 400 lines in the package (issue 39 item 7).

Complexity is ruff's (C901 at 25, pyproject.toml); length is counted here with `ast`, from the
`def`/`class` line to the last line (decorators not counted), nested functions on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).parents[1]
PACKAGES = ("ens", "adapters", "notifiers", "filters", "profiles", "bench")
MAX_FUNCTION = 80
MAX_CLASS = 400

# Files another branch is rewriting now: measured again when it is merged.
PENDING = {
    "adapters/spark": "issue 39: after spark-perf",
    "filters/partitions.py": "issue 39: after spark-perf",
    "filters/partstate.py": "issue 39: after spark-perf",
    "adapters/service/alarm_worker.py": "issue 39: after alarm-oom",
    "adapters/service/alarm_store.py": "issue 39: after alarm-oom",
}

# path:qualified name -> why it may stay longer.
ALLOWED: dict[str, str] = {
    "ens/cli.py:replay": "not split yet (issue 39 item 7 left)",
    "ens/commands/post.py:post": "not split yet (issue 39 item 7 left)",
    "ens/commands/profile.py:profile_add": "not split yet (issue 39 item 7 left)",
    "ens/commands/spark.py:replay": "not split yet (issue 39 item 7 left)",
    "ens/commands/spark.py:stream": "not split yet (issue 39 item 7 left)",
    "ens/commands/subscriber.py:subscriber_add": "not split yet (issue 39 item 7 left)",
    "adapters/generate/facility.py:_Feed": "not split yet (issue 39 item 7 left)",
    "adapters/service/api.py:create_app": "not split yet (issue 39 item 7 left)",
    "adapters/service/routes/ingest.py:post_events": "not split yet (issue 39 item 7 left)",
    "adapters/service/server.py:_serve": "not split yet (issue 39 item 7 left)",
    "adapters/service/settings.py:ServiceSettings": "not split yet (issue 39 item 7 left)",
    "notifiers/digests.py:Digests._flush_digest_one": "not split yet (issue 39 item 7 left)",
    "notifiers/routing/config.py:parse_routing": "not split yet (issue 39 item 7 left)",
    "notifiers/sending.py:Sending._deliver_one": "not split yet (issue 39 item 7 left)",
    "filters/engine.py:Engine": "not split yet (issue 39 item 7 left)",
    "filters/plans.py:choose": "not split yet (issue 39 item 7 left)",
    "bench/composite.py:measure": "not split yet (issue 39 item 7 left)",
    "bench/lazy.py:run": "not split yet (issue 39 item 7 left)",
    "bench/service_load.py:main": "not split yet (issue 39 item 7 left)",
}


def _pending(rel: str) -> bool:
    return any(rel == p or rel.startswith(p + "/") for p in PENDING)


def _too_long() -> list[str]:
    found: list[str] = []

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                size = (child.end_lineno or child.lineno) - child.lineno + 1
                limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                if size > limit and f"{rel}:{name}" not in ALLOWED:
                    found.append(f"{rel}:{child.lineno} {name}: {size} lines (> {limit})")
                visit(child, rel, f"{name}.")
            else:
                visit(child, rel, prefix)

    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not _pending(rel):
                visit(ast.parse(path.read_text(encoding="utf-8")), rel, "")
    return found


def test_no_function_or_class_is_too_long() -> None:
    assert _too_long() == []


def test_the_allow_list_names_only_what_exists() -> None:
    """An entry whose function shrank or went away is removed, so the list stays short."""
    names: set[str] = set()
    for key in ALLOWED:
        rel, name = key.split(":")
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == name.split(".")[-1]:
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
                    if size > limit:
                        names.add(key)
    assert names == set(ALLOWED)
