"""Every graded suite catches the buggy implementations kept in ``tests/buggy/``.

A suite that gives full marks to a broken allocator teaches nothing, so each lab keeps a set of
mutants in ``tests/buggy/lab_NN.py`` (the solution with one plausible learner mistake, see
``grading.mutants``) and every one must lose points. ``python -m grading check-suites`` prints
the same verdicts as a table.

Grading one implementation takes seconds (child processes, property tests, timing tests; half a
minute for the labs that need torch or the model), so each mutant is graded the way
``check-suites`` grades it (``grading.check_suites.check_mutant``): the test it names in
``caught_by`` first, stopping at the first failure. The mutants of one lab are graded two at a
time in one test, and every miss is reported at once rather than one per run.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from grading.check_suites import check_mutant, check_mutants
from grading.labs import REPO_ROOT, Lab, available_labs, load_lab
from grading.mutants import mutants_for
from grading.runner import SuiteRunner

#: A lab keeps at least this many mutants; a quiz's answer sheet has fewer ways to be wrong.
MIN_MUTANTS = {"lab": 10, "quiz": 1}
WORKERS = 2

LABS = available_labs()
LABS_WITH_MUTANTS = [lab for lab in LABS if mutants_for(lab)]


def mutants_file(lab: Lab) -> Path:
    return REPO_ROOT / "tests" / "buggy" / f"{lab.kind}_{lab.number}.py"


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_lab_keeps_enough_mutants(lab: Lab):
    path = mutants_file(lab).relative_to(REPO_ROOT)
    if not mutants_file(lab).exists():
        pytest.skip(f"{lab.id} has no {path} yet: nothing checks that its suite catches bugs")
    mutants = mutants_for(lab)
    least = MIN_MUTANTS.get(lab.kind, MIN_MUTANTS["lab"])
    assert len(mutants) >= least, (
        f"{lab.id} has {len(mutants)} buggy implementations in {path}; keep at least {least} "
        "(realistic learner mistakes the suite must catch)"
    )
    names = [m.name for m in mutants]
    assert len(set(names)) == len(names), f"{lab.id}: mutant names must be unique: {names}"
    for mutant in mutants:
        assert mutant.file in lab.files, f"{lab.id} {mutant.name}: {mutant.file} is not a lab file"
        assert len(mutant.why) > 20, f"{lab.id} {mutant.name}: say why this is a bug"
        file, _, test = mutant.caught_by.partition("::")
        assert test and (lab.suite_dir / file).is_file(), (
            f"{lab.id} {mutant.name}: caught_by={mutant.caught_by!r} names no test file of "
            f"{lab.suite_dir.relative_to(REPO_ROOT)} (write it as 'test_file.py::test_name')"
        )


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


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lab", LABS_WITH_MUTANTS, ids=[lab.id for lab in LABS_WITH_MUTANTS])
def test_every_mutant_loses_points(lab: Lab):
    mutants = mutants_for(lab)
    tests = SuiteRunner(lab, lab.solution_dir).collect()  # the test list is the same for all
    verdicts = check_mutants(lab, tests, WORKERS)
    wrong = [
        f"- {m.name}: scored {v.score}/{v.total}, {v.detail} ({m.why})"
        for m, v in zip(mutants, verdicts)
        if not v.ok
    ]
    suite = lab.suite_dir.relative_to(REPO_ROOT)
    assert not wrong, (
        f"{len(wrong)} of the {len(mutants)} buggy implementations of {lab.id} are not caught "
        f"by the test they name (strengthen {suite}/ or correct caught_by):\n" + "\n".join(wrong)
    )


def test_a_mutant_caught_by_another_test_than_it_names_is_not_ok():
    """caught_by is checked, not just used for speed: a test that stopped catching its bug is
    reported even when a later test still catches it, with the test that did."""
    lab = load_lab("quiz-01")
    mutant = next(m for m in mutants_for(lab) if m.name == "seam_is_the_runner")
    stale = dataclasses.replace(mutant, caught_by="test_quiz.py::test_q10_processes")
    tests = SuiteRunner(lab, lab.solution_dir).collect()
    verdict = check_mutant(lab, stale, tests)
    assert not verdict.ok
    assert "caught by test_quiz.py::test_q01_the_seam" in verdict.detail, verdict.detail
    assert "test_q10_processes" in verdict.detail, verdict.detail
    assert check_mutant(lab, mutant, tests).ok
