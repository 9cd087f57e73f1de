"""The layering is a contract (docs/architecture.md, "Layers"): import-linter's contracts hold, no module
imports another app's private names, no app imports another inside a function (a hidden cycle), and
every module loads first after start-up."""

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from config.api import api

ROOT = Path(__file__).resolve().parents[2]
# Reads the source only: the same in both modes, so it runs in the embedded half only (tests/conftest.py).
pytestmark = pytest.mark.anymode
APPS = ("core", "tenancy", "runs", "agents", "tools", "approvals", "dashboard", "api", "config")


def _modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                yield app, path


def _cross_app_imports():
    """(file, imported module, inside a function?, imported names) for every import of another app."""
    for app, path in _modules():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [(node.module, [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                modules = [(a.name, []) for a in node.names]
            else:
                continue
            for module, names in modules:
                if module.split(".")[0] not in APPS or module.split(".")[0] == app:
                    continue
                scope, inside = node, None
                while scope in parents and inside is None:
                    scope = parents[scope]
                    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                        # AppConfig.ready is where Django wants start-up imports: not a dodge.
                        inside = scope.name != "ready"
                yield str(path.relative_to(ROOT)), module, bool(inside), names


def test_the_import_linter_contracts_hold():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_every_app_has_its_layer_and_the_exceptions_stay_one():
    """The order of docs/architecture.md; an exception to it is a decision written in pyproject.toml with its
    reason, never a way round: the list may not grow unnoticed."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["layers"] == ["api", "dashboard", "approvals", "runs", "agents", "tools", "tenancy", "core"]
    assert set(APPS) - {"config"} == set(layers["layers"])
    assert layers.get("ignore_imports", []) == ["tools.gate -> approvals.models"]


def test_no_function_level_import_between_apps():
    """An import of another app inside a function hides a cycle from import-linter: there is none. (An
    upper layer that a lower one must reach is called through core.bus, core.hooks or a sweep it
    registered; AppConfig.ready is where start-up imports belong and is not counted.)"""
    found = sorted(f"{path} -> {module}" for path, module, inside, _ in _cross_app_imports() if inside)
    assert found == [], f"{len(found)} lazy imports between apps: put the code in the right layer instead"


LOAD_EACH_FIRST = """
import importlib, os, sys, traceback
import django
django.setup()
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print("FAILED", " ".join(failed))
"""


def test_every_module_loads_first_after_start_up():
    """Imported first in a fresh process (after django.setup), every module loads: no import order that
    a management command, a worker or a test could take breaks on a cycle."""
    names = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or "settings" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            names.append(name)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    env.pop("DATABASE_URL", None), env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EACH_FIRST, *names], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "FAILED" in done.stdout, done.stderr[-3000:]
    failed = done.stdout.split("FAILED", 1)[1].split()
    assert failed == [], f"these modules do not load first: {failed}\n{done.stderr[-3000:]}"


def test_no_module_imports_another_apps_private_names():
    private = [
        f"{path}: {module}.{name}"
        for path, module, _, names in _cross_app_imports()
        for name in names
        if name.startswith("_")
    ]
    assert private == []


def test_operation_ids_keep_the_names_clients_were_generated_with():
    """The API's routers moved to api/ but its operation ids keep their first modules' names."""
    schema = api.get_openapi_schema()
    ids = {op["operationId"] for methods in schema["paths"].values() for op in methods.values()}
    assert "runs_api_create_run" in ids and "approvals_api_decide" in ids and "tools_api_classify_tool" in ids
    assert all(
        i.startswith(("runs_api_", "runs_api_reads_", "runs_api_external_", "tools_api_", "approvals_api_"))
        for i in ids
    )
