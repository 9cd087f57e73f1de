"""bench/run.py --against: the verdicts of its comparison table, and the worktree it builds REF in."""

import importlib.util
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.anymode


@pytest.fixture(scope="module")
def bench_run():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_figure_is_judged_in_its_own_direction(bench_run):
    seen = {
        "engine": {
            "steps_per_s_1": {"ref": [1000, 1100, 1050], "head": [1300, 1250, 1400]},  # more is better
            "cpu_ms_per_step_1": {"ref": [0.26, 0.25, 0.27], "head": [0.48, 0.50, 0.47]},  # a CPU time: less
            "hop_p50_ms": {"ref": [3.0, 3.1], "head": [2.95, 3.05]},
            "pushes_lost": {"ref": [0], "head": [0]},
        }
    }
    verdicts = {row[0]: (row[3], row[4]) for row in bench_run.comparison_rows(seen)}

    assert verdicts["engine: steps_per_s_1"] == ("1.24×", "better")
    assert verdicts["engine: cpu_ms_per_step_1"] == ("1.85×", "WORSE")
    assert verdicts["engine: hop_p50_ms"] == ("0.98×", "within 10%")
    assert verdicts["engine: pushes_lost"] == ("—", "—")  # 0 against 0: no ratio to take


def test_ref_is_checked_out_beside_the_checkout_and_removed_after(bench_run):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    path = bench_run.worktree("HEAD")
    try:
        assert (path / "bench" / "run.py").exists()
        at = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert at == head
    finally:
        bench_run.worktree_remove(path)
    assert not path.exists()
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert str(path) not in listed

    with pytest.raises(SystemExit, match="not a commit"):
        bench_run.worktree("no-such-ref-anywhere")
