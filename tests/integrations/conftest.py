"""The framework adapters run where agents run: in a Python of their own with the frameworks installed
(openai-agents brings a top-level package named ``agents``, which Warden's own app is called too), built
once from the client's extras and reused while its pyproject does not change."""

import fcntl
import hashlib
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integrations.test_external_agent import people  # noqa: F401  (the agent's and the reviewer's tokens)

CLIENT = ROOT / "clients" / "python"
VENV = ROOT / "var" / "venv-agents"
_background: list[threading.Thread] = []


def _python() -> Path:
    return VENV / "bin" / "python"


def _build() -> None:
    """A Python with the client and its adapters' frameworks installed (pip, from the registry), unless the
    one there was built from this pyproject."""
    wanted = hashlib.sha256((CLIENT / "pyproject.toml").read_bytes()).hexdigest()
    marker = VENV / ".installed"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "venv-agents.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the two modes of ./warden test run side by side
        if not (marker.exists() and marker.read_text() == wanted):
            subprocess.run([sys._base_executable, "-m", "venv", "--clear", str(VENV)], check=True)
            source = VENV / "client"  # pip builds in the source tree: a copy keeps the checkout clean
            shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "tests"))
            subprocess.run(
                [str(_python()), "-m", "pip", "install", "-q", f"{source}[openai-agents,langgraph]"],
                check=True, capture_output=True, timeout=900,
            )  # fmt: skip
            marker.write_text(wanted)


def _build_quietly() -> None:
    try:
        _build()
    except Exception:  # noqa: BLE001  (the fixture builds again, in the foreground, and reports it)
        pass


def pytest_collection_finish(session):
    # On a fresh clone the build takes about a minute (pip): it starts with the session, beside the
    # tests that run before these, rather than in the first adapter test's setup.
    wanted = any(
        "agent_python" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("skip")
        for item in session.items
    )
    if wanted and not session.config.option.collectonly and not _background:
        _background.append(threading.Thread(target=_build_quietly, name="venv-agents", daemon=True))
        _background[0].start()


@pytest.fixture(scope="session")
def agent_python() -> str:
    """A Python with the client and its adapters' frameworks installed."""
    for thread in _background:
        thread.join()
    _build()  # nothing to do once the background build is done; raises what made it fail
    return str(_python())
