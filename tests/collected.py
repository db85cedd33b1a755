"""Each lab's graded tests, collected once per test session (collection spawns a process)."""

from __future__ import annotations

import functools

from grading.labs import load_lab
from grading.protocol import TestInfo
from grading.runner import SuiteRunner


@functools.cache
def collected_tests(lab_id: str) -> tuple[TestInfo, ...]:
    lab = load_lab(lab_id)
    return tuple(SuiteRunner(lab, lab.solution_dir).collect())
