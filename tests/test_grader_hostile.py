"""Graded code that attacks the grader: it must survive, and nothing can forge a score."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from grading.labs import load_lab
from grading.report import totals, write_results_json
from grading.runner import SuiteRunner

HOSTILE = Path(__file__).resolve().parent / "hostile"


def grade(name: str, timeout: float = 3.0, first: int = 4):
    """Grade a hostile folder on the first few tests: one restart per crash is what we check."""
    lab = load_lab("lab-01")
    runner = SuiteRunner(lab, HOSTILE / name, timeout=timeout, preflight_timeout=8.0)
    tests = runner.collect()[:first]
    started = time.monotonic()
    results = runner.run(tests)
    return lab, results, time.monotonic() - started


def outcomes(results) -> set[str]:
    return {r.outcome for r in results}


def test_hang_at_import_is_reported_once():
    _, results, elapsed = grade("loop_on_import", first=100)
    assert outcomes(results) == {"timeout"}
    assert totals(results)[0] == 0
    assert elapsed < 30, "one import timeout, not one per test"


def test_exit_at_import():
    _, results, _ = grade("exit_on_import")
    assert totals(results)[0] == 0
    assert outcomes(results) <= {"error", "crashed"}
    assert "SystemExit" in results[0].message or "exit" in results[0].message


def test_infinite_loop_in_methods_times_out_each_test():
    _, results, _ = grade("loop_in_method", timeout=1.5, first=3)
    assert totals(results)[0] == 0
    assert "timeout" in outcomes(results)


def test_segfault_costs_only_the_test():
    _, results, _ = grade("segfault")
    assert totals(results)[0] == 0
    crashed = [r for r in results if r.outcome == "crashed"]
    assert crashed and "SIGSEGV" in crashed[0].message


def test_os_exit_mid_test():
    _, results, _ = grade("os_exit_in_test")
    assert totals(results)[0] == 0
    assert "crashed" in outcomes(results)


def test_output_flood_is_capped():
    _, results, elapsed = grade("output_flood", timeout=20, first=2)
    assert totals(results)[0] == 0
    # Past the cap a write fails (EFBIG): the test fails or its process dies, nothing more.
    assert outcomes(results) <= {"crashed", "timeout", "failed"}
    assert elapsed < 60


def test_forged_results_are_ignored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lab, results, _ = grade("forge_results")
    assert totals(results)[0] == 0
    out = tmp_path / "results.json"
    write_results_json(lab, results, out)
    assert json.loads(out.read_text())["score"] == 0


@pytest.mark.parametrize("name", ["patch_pytest", "patch_test_helpers"])
def test_patching_the_harness_voids_the_run(name):
    from grading.runner import TamperedError

    lab = load_lab("lab-01")
    runner = SuiteRunner(lab, HOSTILE / name, timeout=5)
    with pytest.raises(TamperedError):
        runner.run(runner.collect()[:3])


def test_patching_the_harness_scores_zero_through_the_cli():
    from grading.runner import grade as grade_lab

    _, results = grade_lab("lab-01", HOSTILE / "patch_pytest")
    assert totals(results)[0] == 0
    assert all("run void" in r.message for r in results)


def test_leftover_processes_are_killed(tmp_path, monkeypatch):
    target = tmp_path / "late-results.json"
    monkeypatch.setenv("HOSTILE_RESULTS_TARGET", str(target))
    _, results, _ = grade("spawn_daemon")
    assert totals(results)[0] == 0
    time.sleep(6)
    assert not target.exists(), "a process left behind by graded code outlived the grade"
    assert os.environ.get("HOSTILE_RESULTS_TARGET")
