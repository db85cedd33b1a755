"""``python -m grading check-suites``: can each suite tell right from wrong?

For every lab: the stub must score 0 without crashing the grader, the solution must score full
marks, and every mutant kept in ``tests/buggy/`` must lose points. Prints a table per lab with
the share of mutants caught; exits 1 if anything is off.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grading.labs import Lab, matches, test_name
from grading.mutants import Mutant, mutants_for
from grading.protocol import TestInfo, TestResult
from grading.report import totals
from grading.runner import SuiteRunner


@dataclass
class Verdict:
    subject: str
    score: int
    total: int
    expected: str
    ok: bool
    detail: str = ""


def grade_folder(
    lab: Lab, folder: Path, tests: list[TestInfo]
) -> tuple[int, int, list[TestResult]]:
    results = SuiteRunner(lab, folder).run(tests)
    score, total = totals(results)
    return score, total, results


def grade_edited_solution(lab: Lab, folder: Path, tests: list[TestInfo]) -> list[TestResult]:
    """Grade a copy of the solution with one mistake in it: ``tests`` in order, stopping at the
    first failure (one is enough to tell it from the solution), without the pre-import (an
    edit of the solution imports)."""
    return SuiteRunner(lab, folder, fail_fast=True, preflight=False).run(tests)


def check_mutant(lab: Lab, mutant: Mutant, tests: list[TestInfo]) -> Verdict:
    """Grade ``mutant`` on ``tests`` (the suite as collected once for all mutants), its
    ``caught_by`` test first. Ok when it loses points on that very test."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        folder = mutant.materialize(lab, Path(tmp) / lab.dirname)
        results = grade_edited_solution(lab, folder, mutant.first(tests))
    score, total = totals(results)
    failed = [r for r in results if r.outcome not in ("passed", "skipped")]
    if not failed:
        return Verdict(f"bug: {mutant.name}", score, total, "< full", False, "full marks for a bug")
    caught = test_name(failed[0].info.nodeid)
    named = mutant.caught_by and matches(mutant.caught_by, failed[0].info.nodeid)
    if named:
        return Verdict(f"bug: {mutant.name}", score, total, "< full", True, caught)
    detail = (
        f"caught by {caught}, but caught_by names {mutant.caught_by or 'no test'}: "
        f'write caught_by="{caught}" in tests/buggy/{lab.kind}_{lab.number}.py'
        + (" (or find why that test stopped catching it)" if mutant.caught_by else "")
    )
    return Verdict(f"bug: {mutant.name}", score, total, "< full", False, detail)


def check_mutants(lab: Lab, tests: list[TestInfo], workers: int = 2) -> list[Verdict]:
    """:func:`check_mutant` for every mutant of ``lab``, ``workers`` at a time, in order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda m: check_mutant(lab, m, tests), mutants_for(lab)))


def check_lab(lab: Lab, workers: int = 2) -> list[Verdict]:
    verdicts = []
    # Collecting runs no graded code, so one list serves the stub, the solution and the mutants.
    tests = SuiteRunner(lab, lab.solution_dir).collect()
    score, total, results = grade_folder(lab, lab.stub_dir, tests)
    bad = [r.outcome for r in results if r.outcome not in ("not_started",)]
    verdicts.append(
        Verdict(
            "stub",
            score,
            total,
            "0, all NOT STARTED",
            score == 0 and not bad,
            f"{len(bad)} tests not NOT STARTED" if bad else "",
        )
    )
    score, total, results = grade_folder(lab, lab.solution_dir, tests)
    failed = [r.info.name for r in results if r.outcome != "passed"]
    # A timeout needs room for slower correct code on a busy laptop: the test nearest its own.
    limit = {r.info.nodeid: r.info.time_limit(lab.timeout) for r in results}
    tightest = max(results, key=lambda r: r.duration / limit[r.info.nodeid], default=None)
    if tightest is not None:
        failed.append(
            f"tightest: {tightest.info.name} {tightest.duration:.1f} s "
            f"of {limit[tightest.info.nodeid]:g} s"
        )
    verdicts.append(Verdict("solution", score, total, "full", score == total, ", ".join(failed)))
    verdicts.extend(check_mutants(lab, tests, workers))
    return verdicts


def print_verdicts(lab: Lab, verdicts: list[Verdict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if Console().is_terminal else 140)
    table = Table(title=f"{lab.id}: suite quality")
    for column in ("subject", "score", "expected", "ok", "failing tests"):
        table.add_column(column, overflow="fold")
    for v in verdicts:
        mark = "[green]yes[/]" if v.ok else "[red]NO[/]"
        table.add_row(v.subject, f"{v.score}/{v.total}", v.expected, mark, v.detail)
    console.print(table)
    bugs = [v for v in verdicts if v.subject.startswith("bug:")]
    caught = sum(v.ok for v in bugs)
    if bugs:
        console.print(
            f"{lab.id}: {caught}/{len(bugs)} buggy implementations caught "
            f"({100 * caught / len(bugs):.0f} %)"
        )
