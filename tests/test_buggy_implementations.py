"""Every graded suite catches the buggy implementations kept in ``tests/buggy/lab_NN.py``.

A suite that gives full marks to a broken allocator teaches nothing, so each lab keeps a set of
mutants (the solution with one plausible learner mistake, see ``grading.mutants``) and every one
must lose points. ``python -m grading check-suites`` prints the same verdicts as a table.

Grading one implementation takes a few seconds (child processes, property tests, timing tests),
so the mutants of one lab are graded two at a time in one test, and every miss is reported at
once rather than one per run.
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from grading.labs import REPO_ROOT, Lab, available_labs
from grading.mutants import Mutant, mutants_for
from grading.report import totals
from grading.runner import SuiteRunner

if TYPE_CHECKING:  # imported by name, pytest would try to collect the class TestInfo
    from grading.protocol import TestInfo

MIN_MUTANTS = 10
WORKERS = 2

LABS = available_labs()
LABS_WITH_MUTANTS = [lab for lab in LABS if mutants_for(lab)]


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_lab_keeps_enough_mutants(lab: Lab):
    mutants = mutants_for(lab)
    if not (REPO_ROOT / "tests" / "buggy" / f"lab_{lab.number}.py").exists():
        pytest.skip(f"{lab.id} has no tests/buggy/lab_{lab.number}.py yet: its suite is unchecked")
    assert len(mutants) >= MIN_MUTANTS, (
        f"{lab.id} has {len(mutants)} buggy implementations in tests/buggy/lab_{lab.number}.py; "
        f"keep at least {MIN_MUTANTS} (realistic learner mistakes the suite must catch)")
    names = [m.name for m in mutants]
    assert len(set(names)) == len(names), f"{lab.id}: mutant names must be unique: {names}"
    for mutant in mutants:
        assert mutant.file in lab.files, f"{lab.id} {mutant.name}: {mutant.file} is not a lab file"
        assert len(mutant.why) > 20, f"{lab.id} {mutant.name}: say why this is a bug"


@pytest.mark.parametrize("lab", LABS_WITH_MUTANTS, ids=[lab.id for lab in LABS_WITH_MUTANTS])
def test_mutants_apply_to_the_current_solution(lab: Lab, tmp_path: Path):
    """Cheap and first: a mutant whose ``find`` no longer matches the solution fails here."""
    problems = []
    for mutant in mutants_for(lab):
        try:
            folder = mutant.materialize(lab, tmp_path / mutant.name / lab.dirname)
        except ValueError as exc:
            problems.append(f"{mutant.name}: {exc}")
            continue
        text = (folder / mutant.file).read_text()
        if text == (lab.solution_dir / mutant.file).read_text():
            problems.append(f"{mutant.name}: the edit changes nothing")
            continue
        try:
            ast.parse(text)
        except SyntaxError as exc:
            problems.append(f"{mutant.name}: the edited file does not parse ({exc})")
    assert not problems, "\n".join(problems)


def _grade(lab: Lab, tests: list[TestInfo], mutant: Mutant, root: Path) -> tuple[int, int, str]:
    folder = mutant.materialize(lab, root / mutant.name / lab.dirname)
    results = SuiteRunner(lab, folder).run(tests)
    score, total = totals(results)
    failing = ", ".join(r.info.name for r in results if r.outcome != "passed")
    return score, total, failing


@pytest.mark.parametrize("lab", LABS_WITH_MUTANTS, ids=[lab.id for lab in LABS_WITH_MUTANTS])
def test_every_mutant_loses_points(lab: Lab, tmp_path: Path):
    mutants = mutants_for(lab)
    tests = SuiteRunner(lab, lab.solution_dir).collect()  # the test list is the same for all
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        graded = list(pool.map(lambda m: _grade(lab, tests, m, tmp_path), mutants))
    missed = [
        f"- {m.name}: scored {score}/{total}, full marks for a bug: {m.why}"
        for m, (score, total, _) in zip(mutants, graded)
        if score >= total
    ]
    assert not missed, (
        f"the {lab.id} suite misses {len(missed)} of {len(mutants)} buggy implementations "
        f"(strengthen tests/labs/lab_{lab.number}/):\n" + "\n".join(missed))
