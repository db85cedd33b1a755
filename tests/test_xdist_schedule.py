"""`make test`'s two workers keep a file's tests together and spread the slow cases.

The grouping is what keeps the real model loaded once and the servers started once (see
``tests/conftest.py``); when it broke (pytest 9.2 dropped the node-id suffix xdist's own
loadgroup relied on), nothing failed and CI only got minutes slower. This runs the project's
conftest over a small tree, on two workers, and reads which worker ran what.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="make test installs pytest-xdist")

CONFTEST = Path(__file__).with_name("conftest.py")

MODULE_WITH_FIXTURE = """
import json, os, pytest

@pytest.fixture(scope="module")
def loaded():
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps(["setup", __name__, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.parametrize("i", range(4))
def test_uses_it(loaded, i):
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps(["test", __name__, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""

SPREAD = """
import json, os, time, pytest

@pytest.mark.parametrize("i", range(2))
def test_slow_case(i):
    time.sleep(1.0)  # long enough that the other worker takes the next case
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps(["spread", i, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""


def test_files_stay_on_one_worker_and_spread_cases_go_to_both(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "serve").mkdir(parents=True)
    shutil.copyfile(CONFTEST, tests / "conftest.py")
    (tests / "test_model.py").write_text(MODULE_WITH_FIXTURE)
    (tests / "serve" / "test_one.py").write_text(MODULE_WITH_FIXTURE)
    (tests / "serve" / "test_two.py").write_text(MODULE_WITH_FIXTURE)
    (tests / "test_buggy_implementations.py").write_text(SPREAD)
    record = tmp_path / "record.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=tmp_path,
        env={**os.environ, "RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]

    setups = [(module, worker) for kind, module, worker in rows if kind == "setup"]
    assert sorted(m for m, _ in setups) == ["test_model", "test_one", "test_two"], (
        f"a module-scoped fixture was set up more than once per file: {setups}"
    )
    workers = {}
    for kind, module, worker in rows:
        if kind == "test":
            workers.setdefault(module, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), f"a file's tests were split: {workers}"
    assert workers["test_one"] == workers["test_two"], "tests/serve/ runs on one worker"
    spread = {worker for kind, _, worker in rows if kind == "spread"}
    assert len(spread) == 2, f"the slow cases ran on one worker only: {spread}"
