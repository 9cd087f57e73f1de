"""The client installs with pip from the repository path, typed (py.typed) and with httpx alone."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Builds the wheel from the source: the same in both modes, so it runs in the embedded half only.
pytestmark = pytest.mark.anymode


def test_pip_builds_an_installable_typed_wheel(tmp_path):
    source = tmp_path / "src"  # pip builds in the source tree: a copy keeps the checkout clean
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "tests", "__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    wheel_args = ["wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", str(tmp_path)]
    built = subprocess.run([*pip, *wheel_args], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = tmp_path.glob("warden_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"warden_client/__init__.py", "warden_client/py.typed", "warden_client/aio.py"} <= set(names)
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Requires-Dist: httpx" in text and "Name: warden-client" in text
    target = tmp_path / "site"
    install_args = ["install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    installed = subprocess.run([*pip, *install_args], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    check = subprocess.run([sys.executable, "-c", "import warden_client; print(warden_client.__version__)"],
                           capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(target)})  # fmt: skip
    assert check.stdout.strip() == "0.3.0", check.stderr
