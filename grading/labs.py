"""Where the labs live and what each one needs, read from ``tests/labs/lab_NN/lab.json``.

Each suite describes itself in a small JSON file beside its tests, so that adding a lab
never means editing a central table, and the grader, the stub generator, the Makefile
and the sync tests all read the same description.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SUITES_DIR = REPO_ROOT / "tests" / "labs"

#: Every lab of the course, written or not, so that ``make lab-NN`` can say which is which.
PLANNED_LABS: dict[str, str] = {
    "lab-01": "block-allocator",
    "lab-02": "fragmentation-viz",
    "lab-03": "kv-cache-sizing",
    "lab-04": "triton-paged-attn",
    "lab-05": "share-and-evict",
    "lab-06": "paged-attention-numpy",
    "lab-07": "kv-cache-manager",
    "lab-08": "scheduler",
    "lab-09": "engine",
    "lab-10": "serving",
    "lab-11": "tensor-parallel",
    "quiz-01": "engine-tour",
}


class LabNotFound(Exception):
    """The lab id is unknown, or the lab is planned but not written yet."""


@dataclass(frozen=True)
class Lab:
    """One lab: its id, folders, the files a learner edits and the tasks in them."""

    id: str
    slug: str
    title: str
    phase: str
    files: tuple[str, ...]
    requires: str = "core"
    timeout: float = 10.0
    budget: float = 300.0
    reference: tuple[str, ...] = ()
    tasks: dict[str, dict[str, str]] = field(default_factory=dict)
    provides: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: Reference functions that the learner process holds (its modules import them) and that
    #: implement a task another way (lab-04's torch attention, beside its Triton kernels):
    #: staged stubbed, as the tasks are, so that re-exporting them scores what the stub scores.
    twins: dict[str, list[str]] = field(default_factory=dict)
    #: ``generated`` (from the solution) or ``hand`` (a quiz's answer sheet, never generated).
    stub: str = "generated"
    #: Test files (or node-id prefixes, ``test_x.py::test_y``) in the order the guide teaches
    #: them: the grader runs and prints tests in this order, so that the test of what is
    #: written first (the free queue) comes before the tests that build on it (the pool).
    order: tuple[str, ...] = ()
    #: Reference globals that a copy reads through their module (``NONE_HASH`` ->
    #: ``kv_cache_utils``): the reference rebinds them after import (``init_none_hash``), which a
    #: name imported into a lab file with ``from ... import`` would never see. The reference
    #: writes the bare name; the solution writes ``kv_cache_utils.NONE_HASH``; sync translates.
    read_through: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``lab`` or ``quiz``."""
        return self.id.split("-")[0]

    @property
    def number(self) -> str:
        return self.id.split("-")[1]

    @property
    def dirname(self) -> str:
        return f"{self.id}-{self.slug}"

    @property
    def stub_dir(self) -> Path:
        return REPO_ROOT / "labs" / self.dirname

    @property
    def solution_dir(self) -> Path:
        return REPO_ROOT / "solutions" / self.dirname

    @property
    def suite_dir(self) -> Path:
        return SUITES_DIR / f"{self.kind}_{self.number}"


def normalize_lab_id(name: str) -> str:
    """Accept ``lab-01``, ``lab01``, ``01``, ``1``, ``lab-01-block-allocator`` or ``quiz-01``."""
    m = re.fullmatch(r"(?:(lab|quiz)[-_]?)?(\d{1,2})(?:-[a-z0-9-]+)?", name.strip().lower())
    if not m:
        raise LabNotFound(f"{name!r} is not a lab id; try one of {', '.join(PLANNED_LABS)}")
    return f"{m.group(1) or 'lab'}-{int(m.group(2)):02d}"


def load_lab(name: str) -> Lab:
    """Read a lab's description; a planned lab without a suite says so clearly."""
    lab_id = normalize_lab_id(name)
    kind, number = lab_id.split("-")
    meta_path = SUITES_DIR / f"{kind}_{number}" / "lab.json"
    if not meta_path.exists():
        if lab_id in PLANNED_LABS:
            raise LabNotFound(
                f"{lab_id} ({PLANNED_LABS[lab_id]}) is not written yet: its graded suite does "
                "not exist in this version of the course. See README.md for the labs available."
            )
        raise LabNotFound(f"there is no {lab_id}; the labs are {', '.join(PLANNED_LABS)}")
    raw = json.loads(meta_path.read_text())
    return Lab(
        id=raw["id"],
        slug=raw["slug"],
        title=raw["title"],
        phase=raw["phase"],
        files=tuple(raw["files"]),
        requires=raw.get("requires", "core"),
        timeout=float(raw.get("timeout", 10.0)),
        budget=float(raw.get("budget", 300.0)),
        reference=tuple(raw.get("reference", ())),
        tasks=raw.get("tasks", {}),
        provides=raw.get("provides", {}),
        twins=raw.get("twins", {}),
        stub=raw.get("stub", "generated"),
        order=tuple(raw.get("order", ())),
        read_through=raw.get("read_through", {}),
    )


def test_name(nodeid: str) -> str:
    """``file::test`` of a node id, the way lab.json and the mutants name tests: the suite
    file's name and the test's, without the folder or a parametrized case's ``[...]``."""
    path, _, name = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}::{name.split('[', 1)[0]}"


def matches(entry: str, nodeid: str) -> bool:
    """Whether a test's node id is meant by ``entry``: a suite file name (``test_stop.py``)
    or a ``file::test`` name, which also covers the test's parametrized cases."""
    path, _, name = nodeid.partition("::")
    file_part, _, test_part = entry.partition("::")
    return path.rsplit("/", 1)[-1] == file_part and (
        not test_part or name == test_part or name.startswith(test_part + "[")
    )


def order_key(lab: Lab, nodeid: str) -> int:
    """Where a test comes in ``lab.order``: the first entry its node id :func:`matches`; tests
    matching none come last, in collection order."""
    return next((i for i, entry in enumerate(lab.order) if matches(entry, nodeid)), len(lab.order))


def available_labs() -> list[Lab]:
    """The labs whose suites exist, in course order."""
    found = sorted(SUITES_DIR.glob("*_[0-9][0-9]/lab.json"), key=lambda p: p.parent.name)
    return [load_lab(p.parent.name.replace("_", "-")) for p in found]
