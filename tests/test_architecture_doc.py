"""Every `module:function` that docs/architecture.md names exists (read with `ast`: nothing is
imported, so the Spark modules need no pyspark here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"`([a-z_]+\.[\w.]+):([A-Za-z_][\w.]*)`")


def _defined(tree: ast.Module, qualname: str) -> bool:
    """A top-level function, class or assignment, or a method of a class (``Class.method``)."""
    scope: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        found = None
        for node in scope:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == part:
                    found = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    return i == len(parts) - 1
        if found is None:
            return False
        scope = found.body
    return True


def test_every_name_on_the_page_exists() -> None:
    names = NAME.findall(DOC.read_text())  # dotted modules: not `ens:ingest`, a Redis key
    assert len(names) > 30, "the page names the hops as `module:function`"
    missing = []
    for module, qualname in names:
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.is_file():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        if not path.is_file() or not _defined(ast.parse(path.read_text()), qualname):
            missing.append(f"{module}:{qualname}")
    assert missing == [], f"docs/architecture.md names what does not exist: {missing}"
