"""Functions stay short (about 60 lines), or say above them why not ("# long: …"). LONG lists those still to
split: it may only shrink (empty since issue 14), and a new long function fails here."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Reads the source only: the same in both modes, so it runs in the embedded half only (tests/conftest.py).
pytestmark = pytest.mark.anymode
PACKAGES = ("core", "tenancy", "tools", "agents", "runs", "approvals", "saga", "evals", "dashboard", "api")
LIMIT = 60
REASON = "# long:"  # a comment line right above the def: "# long: why it reads better whole"

LONG: set[str] = set()  # issue 14 split the last of them


def _long_functions() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                above = lines[first - 2].strip() if first > 1 else ""
                if node.end_lineno - node.lineno + 1 > LIMIT and not above.startswith(REASON):
                    found.add(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_no_new_long_function_and_the_list_only_shrinks():
    found = _long_functions()
    assert found - LONG == set(), f"split these (or say above them why not, '{REASON} …')"
    assert LONG - found == set(), "short now (good): take them off LONG"
