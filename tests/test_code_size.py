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


def _too_long() -> list[str]:
    found: list[str] = []

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                size = (child.end_lineno or child.lineno) - child.lineno + 1
                limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                if size > limit:
                    found.append(f"{rel}:{child.lineno} {name}: {size} lines (> {limit})")
                visit(child, rel, f"{name}.")
            else:
                visit(child, rel, prefix)

    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            visit(ast.parse(path.read_text(encoding="utf-8")), rel, "")
    return found


def test_no_function_or_class_is_too_long() -> None:
    assert _too_long() == []
