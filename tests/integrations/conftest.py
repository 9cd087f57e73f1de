"""The framework adapters run where agents run: in a Python of their own with the frameworks installed
(openai-agents brings a top-level package named ``agents``, which Warden's own app is called too), built
once from the client's extras and reused while its pyproject does not change."""

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.runs.test_external_agent import people  # noqa: F401  (the agent's and the reviewer's tokens)

CLIENT = ROOT / "clients" / "python"
VENV = ROOT / "var" / "venv-agents"


def _python() -> Path:
    return VENV / "bin" / "python"


@pytest.fixture(scope="session")
def agent_python() -> str:
    """A Python with the client and its adapters' frameworks installed (pip, from the registry)."""
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
    return str(_python())
