"""``tools/mutation_sweep.py`` edits graded code only, never strings, and grades as check-suites."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from grading.labs import load_lab
from grading.runner import SuiteRunner
from tools.mutation_sweep import edits, grade, graded_spans

LAB = load_lab("lab-01")
SOLUTION = (LAB.solution_dir / "block_pool.py").read_text()


def strings(text: str) -> list[str]:
    return [
        t.string
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type == tokenize.STRING
    ]


def test_edits_stay_inside_the_graded_functions_and_out_of_strings():
    found = edits(LAB)
    spans = graded_spans(SOLUTION, set(LAB.tasks["block_pool.py"]))
    edited = {e.function for e in found}
    graded = {name for name, *_ in spans}
    assert edited == graded, "every graded function gets edits (a return at least); nothing else"
    solution_strings = strings(SOLUTION)
    for e in found:
        ast.parse(e.text)
        assert e.text != SOLUTION, e
        span = next((first, last) for name, first, last, _ in spans if name == e.function)
        assert span[0] <= e.line <= span[1], f"{e} is outside {e.function}"
        if not e.kind.endswith(" deleted"):
            assert strings(e.text) == solution_strings, f"{e} changed a string literal"
    kinds = {e.kind for e in found if "hash_block_size < 1" in e.before}
    assert {"< -> <=", "1 -> 0", "1 -> 2"} <= kinds, kinds

    def kinds_at(line: str) -> set[str]:
        return {e.kind for e in found if e.before == line}

    assert {"condition -> True", "condition -> False"} <= kinds_at("if block.is_null:")
    assert {"bound + 1", "bound - 1"} <= kinds_at("for _ in range(n):")
    assert "arguments swapped" in kinds_at("self._unlink_after(anchor, count)")
    assert "-= -> =" in kinds_at("self.num_free_blocks -= n")
    assert "return deleted" in kinds_at("return []")
    unwrapped = [e for e in found if e.kind == "list() removed"]
    assert [e.describe().split("  ->  ")[1] for e in unwrapped] == ["blocks = ordered_blocks"]


def test_an_edit_the_suite_catches_loses_points(tmp_path: Path):
    """``hash_block_size <= 1`` refuses legal one-token blocks; its test must catch it."""
    edit = next(e for e in edits(LAB) if "hash_block_size < 1" in e.before and "<=" in e.kind)
    tests = [
        t
        for t in SuiteRunner(LAB, LAB.solution_dir).collect()
        if t.name == "bad_pool_sizes_are_errors"
    ]
    score, total = grade(LAB, edit, tests, tmp_path)
    assert total > 0 and score == 0, (score, total)


def test_commuting_arguments_are_not_swapped():
    """``min(a, b)`` swapped is the same call: grading it would only add a survivor."""
    lab07 = edits(load_lab("lab-07"))
    assert any("min(" in e.before for e in lab07), "lab-07's manager has min() calls"
    swapped = [e for e in lab07 if e.kind == "arguments swapped"]
    assert swapped, "lab-07 has calls whose arguments do not commute"
    assert not [e for e in swapped if "min(" in e.before or "max(" in e.before], swapped
