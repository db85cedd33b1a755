"""Buggy implementations, kept as small edits of a lab's solution (mutants).

A mutant is the solution with one plausible mistake: an off-by-one, a forgotten unlink, a
forward free instead of a reverse one. Keeping each as an edit (a ``find`` text that must occur
exactly once in the solution, and its ``replace``) instead of a copy of the whole file keeps the
set small and readable, and makes it fail loudly when the solution changes under it.
``python -m grading check-suites`` grades every mutant and reports which ones a suite misses.

Each mutant also names the graded test that catches it (``caught_by``). That test runs first,
so checking a suite costs about one test per mutant instead of every test written before the
bug's function, and the name is checked: a test that stops catching its bug is reported even
when a later test still catches it.
"""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

from grading.labs import REPO_ROOT, Lab, matches
from grading.protocol import TestInfo


@dataclass(frozen=True)
class Mutant:
    """One buggy implementation: ``find`` (exactly once in ``file``) becomes ``replace``;
    ``caught_by`` is the suite's test that fails on it (``test_file.py::test_name``)."""

    name: str
    file: str
    find: str
    replace: str
    why: str
    caught_by: str = ""
    #: Further ``(find, replace)`` edits of the same file, applied in order after the first,
    #: for a mistake that spans two places (work moved from a helper into its caller).
    more: tuple[tuple[str, str], ...] = ()

    def first(self, tests: list[TestInfo]) -> list[TestInfo]:
        """``tests`` with the ones ``caught_by`` names moved to the front (a stable sort)."""
        return sorted(
            tests, key=lambda t: not (self.caught_by and matches(self.caught_by, t.nodeid))
        )

    def materialize(self, lab: Lab, dest: Path) -> Path:
        """Write the solution with this bug applied into ``dest``; return ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        for filename in lab.files:
            shutil.copy(lab.solution_dir / filename, dest / filename)
        path = dest / self.file
        text = path.read_text()
        for find, replace in [(self.find, self.replace), *self.more]:
            text = self._edit(text, find, replace, lab)
        path.write_text(text)
        return dest

    def _edit(self, text: str, find: str, replace: str, lab: Lab) -> str:
        """``text`` with ``find`` (exactly once) replaced by ``replace``."""
        find, replace = textwrap.dedent(find).strip("\n"), textwrap.dedent(replace)
        replace = replace.strip("\n")
        # Re-indent both to where ``find`` sits in the file. A one-line ``find`` may sit in
        # the middle of a line: the replacement's further lines then take that line's indent.
        first = find.splitlines()[0]
        for indent in (" " * n for n in range(0, 17, 4)):
            candidate = textwrap.indent(find, indent)
            if text.count(candidate) != 1:
                continue
            i = text.index(candidate)
            line_start = text.rfind("\n", 0, i) + 1
            if i == line_start:
                replacement = textwrap.indent(replace, indent)
            else:
                line = text[line_start:]
                line_indent = line[: len(line) - len(line.lstrip(" "))]
                head, *rest = replace.splitlines() or [""]
                replacement = "\n".join([head, *[line_indent + r if r else r for r in rest]])
            return text[:i] + replacement + text[i + len(candidate) :]
        raise ValueError(
            f"mutant {self.name}: {first.strip()!r}… does not occur exactly "
            f"once in {lab.solution_dir / self.file}"
        )


def mutants_for(lab: Lab) -> list[Mutant]:
    """The mutants kept in ``tests/buggy/lab_NN.py`` (or ``quiz_NN.py``); none if absent.

    The file is found from the repository root, not through ``sys.path``: ``make`` runs the
    grader with ``PYTHONSAFEPATH``, where the working folder (and so ``tests``) is not
    importable, and a missing module must not pass for a lab without mutants.
    """
    path = REPO_ROOT / "tests" / "buggy" / f"{lab.kind}_{lab.number}.py"
    if not path.is_file():
        return []
    spec = importlib.util.spec_from_file_location(f"_mutants_{lab.kind}_{lab.number}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MUTANTS)
