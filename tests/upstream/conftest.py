"""Collect vLLM v0.22.1's own core tests from the sdist and run the selected ones on mini_vllm.

Nothing of upstream's test code lives in this repository: ``selected.txt`` names the tests, and
this conftest turns that file into a pytest collector (``pytest_collect_file``) whose children
are upstream's test modules, read from the unpacked sdist (``tools/fetch_upstream.py``
downloads it on first use) and imported through the shim (``shim.py``). Node ids read
``tests/upstream/selected.txt::test_prefix_caching.py::test_prefill[sha256]``, so a single
upstream test runs with ``pytest "tests/upstream/selected.txt::test_prefix_caching.py::test_evict"``
or ``pytest tests/upstream -k test_evict``.

Every selected test reports pass/fail on its own. Known, deliberate differences are marked
``xfail(strict=True, raises=NotImplementedError)`` with the reason from ``selected.txt``: if
mini_vllm changes so that one passes, or it fails any other way than by the shim refusing a
feature, the run fails until the list is updated. Tests marked ``out`` are not collected
(``selection.py`` checks that every upstream test is listed); a listed test that upstream does
not define (a typo, a rename at a new pin) fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.fetch_upstream import UpstreamError, ensure_upstream  # noqa: E402

from . import shim  # noqa: E402
from .selection import SELECTED, UPSTREAM_TEST_DIR, Entry, read_selection  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Register upstream's ``cpu_test`` marker (every selected module carries it)."""
    config.addinivalue_line("markers", "cpu_test: upstream's marker for tests needing no GPU")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Turn ``selected.txt`` into the collector of upstream's tests."""
    if file_path == SELECTED:
        return UpstreamSuite.from_parent(parent, path=file_path)
    return None


class UpstreamSuite(pytest.File):
    """``selected.txt``: one child per upstream test file it names."""

    def collect(self) -> Iterator[pytest.Collector]:
        entries = read_selection(self.path)
        try:
            tree = ensure_upstream()
        except UpstreamError as exc:
            raise self.CollectError(
                f"cannot get vLLM's sdist to read its tests ({exc}); run `make upstream`"
            ) from exc
        files: dict[str, list[Entry]] = {}
        for entry in entries:
            if entry.runs:  # out-of-scope tests are listed, never collected
                files.setdefault(entry.file, []).append(entry)
        for name, file_entries in files.items():
            module = UpstreamModule.from_parent(
                self,
                path=tree / UPSTREAM_TEST_DIR / name,
                name=name,
                nodeid=f"{self.nodeid}::{name}",
            )
            module.tree = tree
            module.entries = file_entries
            yield module


class UpstreamModule(pytest.Module):
    """One upstream test file, imported through the shim, filtered by ``selected.txt``."""

    tree: Path
    entries: list[Entry]

    def _getobj(self) -> Any:
        relpath = f"{UPSTREAM_TEST_DIR}/{self.name}"
        with shim.installed():
            return shim.load_test_module(self.tree, relpath, self.config)

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        with shim.installed():  # collection reads the module's objects (fixtures, ids)
            collected = list(super().collect())
            # Methods of test classes (``TestX::test_y``) are collected through their class.
            for node in list(collected):
                if isinstance(node, pytest.Class):
                    collected.extend(node.collect())
        functions = [node for node in collected if isinstance(node, pytest.Function)]
        kept: list[pytest.Item | pytest.Collector] = []
        for item in functions:
            matching = [e for e in self.entries if e.matches(item)]
            if not matching:
                continue
            # A ``name[id]`` entry overrides a whole-function entry.
            entry = max(matching, key=lambda e: e.test == item.name)
            if entry.status == "xfail":
                # Strict, and only for the shim's refusal of a missing feature
                # (UpstreamOnlyError is a NotImplementedError): any other failure is a failure.
                item.add_marker(
                    pytest.mark.xfail(reason=entry.reason, strict=True, raises=NotImplementedError)
                )
            kept.append(item)
        for entry in self.entries:
            if not any(entry.matches(item) for item in functions):
                kept.append(
                    MissingUpstreamTest.from_parent(
                        self, name=f"{entry.test}(missing)", entry=entry
                    )
                )
        self.config.stash.setdefault(_COUNTS, {})[self.name] = (len(kept), len(functions))
        return kept


class MissingUpstreamTest(pytest.Item):
    """A ``selected.txt`` entry that names no upstream test: fails with the line to fix."""

    def __init__(self, *, entry: Entry, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry

    def runtest(self) -> None:
        """Fail with the line of ``selected.txt`` to fix."""
        pytest.fail(
            f"selected.txt:{self.entry.line} names {self.entry.test}, which "
            f"{UPSTREAM_TEST_DIR}/{self.entry.file} does not define at the pin",
            pytrace=False,
        )

    def reportinfo(self) -> tuple[Path, int, str]:
        """Point reports at the offending line of ``selected.txt``."""
        return SELECTED, self.entry.line - 1, self.name


_COUNTS = pytest.StashKey[dict[str, tuple[int, int]]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Keep the shim installed while an upstream test sets up, runs and tears down."""
    if item.getparent(UpstreamModule) is None:
        yield
        return
    with shim.installed():
        yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say how much of each upstream file was selected, next to the pass/fail counts."""
    counts = config.stash.get(_COUNTS, {})
    if not counts:
        return
    parts = [f"{name}: {kept} of {total}" for name, (kept, total) in counts.items()]
    terminalreporter.write_line(
        "upstream suite (vLLM v0.22.1 tests/v1/core, selected.txt): " + ", ".join(parts)
    )
