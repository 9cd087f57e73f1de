"""The layering is a contract (docs/architecture.md, "Layers"): import-linter's contracts hold, no module
imports another app's private names, no module imports its own app or another inside a function (a hidden
cycle), and every module loads first after start-up."""

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
APPS = (
    "core",
    "tenancy",
    "policy",
    "runs",
    "agents",
    "tools",
    "approvals",
    "replay",
    "saga",
    "evals",
    "integrations",
    "dashboard",
    "api",
    "config",
)


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


# Function-level imports inside an app that stay, each by (file, function) with its reason. AppConfig.ready
# is where Django wants start-up imports and is not counted; neither is an optional third-party SDK (not
# an app's module). Everything else is a cycle dodged: put the code where both sides can import it.
LAZY_INSIDE_AN_APP: dict[tuple[str, str], str] = {}  # (file, function) → why it must stay lazy: none does


def _lazy_imports_inside_apps():
    """(file, function, line, module) for every import of a module of the file's own app inside a function
    (relative, or absolute and naming the app), but for AppConfig.ready."""
    for app, path in _modules():
        rel = path.relative_to(ROOT)
        package = rel.parent.parts  # the module's package, which a relative import starts from
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - node.level + 1]
                modules = [".".join((*base, node.module) if node.module else base)]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            scope = node
            while scope in parents and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                scope = parents[scope]
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) or scope.name == "ready":
                continue
            for module in modules:
                if module.split(".")[0] == app:
                    yield str(rel), scope.name, node.lineno, module


def test_the_import_linter_contracts_hold():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_every_app_has_its_layer_and_there_is_no_exception():
    """The order of docs/architecture.md, with no exception: the gate reads the rules of a decision from the
    policy app below it, so no layer reaches above itself (an exception would have to be argued here)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    order = [
        "api | dashboard",
        "approvals | replay",
        "saga | evals | integrations",
        "runs",
        "agents",
        "tools",
        "policy",
        "tenancy",
        "core",
    ]
    assert layers["layers"] == order  # "a | b": siblings in one layer, neither importing the other
    assert set(APPS) - {"config"} == {app.strip() for layer in order for app in layer.split("|")}
    assert layers.get("ignore_imports", []) == []


def test_the_api_and_the_pages_are_peers():
    """api and dashboard sit side by side above the apps: neither imports the other (siblings in the top
    layer, "api | dashboard"), so both read through the apps' selectors and a page's change never breaks
    the API."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["layers"][0] == "api | dashboard"


def test_no_function_level_import_between_apps():
    """An import of another app inside a function hides a cycle from import-linter: there is none. (An
    upper layer that a lower one must reach is called through core.bus, core.hooks or a sweep it
    registered; AppConfig.ready is where start-up imports belong and is not counted.)"""
    found = sorted(f"{path} -> {module}" for path, module, inside, _ in _cross_app_imports() if inside)
    assert found == [], f"{len(found)} lazy imports between apps: put the code in the right layer instead"


def test_no_function_level_import_inside_an_app():
    """An import of a module of the same app inside a function hides a cycle too: both sides import a
    small module that holds what they share, or the function moves to where its callers are. The few
    that stay are named in LAZY_INSIDE_AN_APP with their reason (and may only shrink)."""
    found = list(_lazy_imports_inside_apps())
    offenders = sorted(f"{path}:{line} {function}() imports {module}" for path, function, line, module in found
                       if (path, function) not in LAZY_INSIDE_AN_APP)  # fmt: skip
    assert offenders == [], f"{len(offenders)} lazy imports inside an app:\n" + "\n".join(offenders)
    stale = sorted(set(LAZY_INSIDE_AN_APP) - {(path, function) for path, function, _, _ in found})
    assert stale == [], f"no longer lazy, take them off LAZY_INSIDE_AN_APP: {stale}"


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


def test_the_readme_layout_names_every_folder_of_the_tree():
    """README's "Layout" is the map a newcomer reads first: every top-level folder in the repository is on
    it, and it names none that is gone."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    named = {line.split("/", 1)[0] for line in block.splitlines() if line[:1].isalpha() and "/" in line.split()[0]}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {path.split("/", 1)[0] for path in tracked.splitlines() if "/" in path and not path.startswith(".")}
    assert named == folders, f"missing from the layout: {folders - named}; gone from the tree: {named - folders}"
