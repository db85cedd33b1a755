"""``selected.txt`` classifies every upstream core test, and the docs' table is generated from it.

Upstream's test files are read from the sdist (``ensure_upstream``); nothing is imported from them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.fetch_upstream import ensure_upstream

from . import selection
from .selection import Entry


@pytest.fixture(scope="module")
def functions() -> dict[str, list[str]]:
    return selection.upstream_test_functions(ensure_upstream())


def test_every_upstream_test_is_classified_once(functions: dict[str, list[str]]) -> None:
    entries = selection.read_selection()
    assert selection.classification_problems(entries, functions) == []
    counts = selection.counts(entries, functions)
    assert sum(counts.values()) == sum(len(names) for names in functions.values())


def test_the_docs_table_is_generated_from_selected_txt(functions: dict[str, list[str]]) -> None:
    entries = selection.read_selection()
    page = selection.DOC.read_text(encoding="utf-8")
    section = selection.doc_section(page)
    assert section is not None, f"{selection.DOC} lost its {selection.BEGIN!r} section"
    assert section == selection.render_table(entries, functions), (
        "docs/upstream-fidelity.md is stale: run `python -m tests.upstream.selection --write`"
    )


def test_the_checks_catch_drift(tmp_path: Path) -> None:
    functions = {"test_a.py": ["test_x", "test_y", "TestC::test_z"], "test_b.py": ["test_w"]}
    good = [
        Entry("test_a.py", "test_x", "pass", "", 1),
        Entry("test_a.py", "test_x[1]", "xfail", "why", 2),
        Entry("test_a.py", "test_y", "out", "why", 3),
        Entry("test_b.py", "*", "out", "why", 4),
    ]
    problems = selection.classification_problems(good, functions)
    assert problems == ["test_a.py::TestC::test_z is not classified in selected.txt"]
    bad = [
        Entry("test_a.py", "*", "out", "why", 1),
        Entry("test_a.py", "test_x", "pass", "", 2),
        Entry("test_b.py", "test_w", "pass", "", 3),
        Entry("test_b.py", "test_w", "out", "why", 4),
        Entry("test_b.py", "test_gone", "pass", "", 5),
        Entry("test_b.py", "test_w[2]", "out", "why", 6),
        Entry("test_c.py", "test_q", "pass", "", 7),
    ]
    text = "\n".join(selection.classification_problems(bad, functions))
    for expected in [
        "::* and other entries",
        "listed twice",
        "defines no test test_gone",
        "must refine a pass or xfail",
        "upstream has no test_c.py",
    ]:
        assert expected in text
    listing = tmp_path / "selected.txt"
    listing.write_text("test_a.py::*  pass\n")
    with pytest.raises(ValueError, match="only a whole file out of scope"):
        selection.read_selection(listing)
    listing.write_text("test_a.py::test_x  out\n")
    with pytest.raises(ValueError, match="needs a reason"):
        selection.read_selection(listing)
