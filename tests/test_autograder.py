"""The Gradescope bundle, run the way Gradescope runs it, in a folder laid out like its image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grading.autograder import build_autograder
from grading.labs import load_lab
from grading.sandbox import sandbox_mode
from tests.test_grader_hostile import header


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return build_autograder(load_lab("lab-01"), tmp_path_factory.mktemp("dist"))


def run_submission(bundle: Path, root: Path, files: dict[str, Path]) -> dict:
    """Unpack into root/source, put the files in root/submission, run run_autograder."""
    (root / "source").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    for script in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / script, 0o755)
    submission = root / "submission" / "my-work"
    submission.mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, submission / name)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")],
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_bundle_layout(bundle):
    names = zipfile.ZipFile(bundle).namelist()
    assert {
        "setup.sh",
        "run_autograder",
        "course/pyproject.toml",
        "course/grading/__main__.py",
        "course/tests/labs/lab_01/lab.json",
    } <= set(names)
    assert not any(n.startswith("course/solutions") for n in names), "never ship solutions"
    setup = zipfile.ZipFile(bundle).read("setup.sh").decode()
    assert "pip install" in setup and "-e" in setup


def test_stub_scores_zero(bundle, tmp_path):
    lab = load_lab("lab-01")
    data = run_submission(bundle, tmp_path, {"block_pool.py": lab.stub_dir / "block_pool.py"})
    assert data["score"] == 0 and data["tests"]


def test_solution_full_marks(bundle, tmp_path):
    lab = load_lab("lab-01")
    data = run_submission(bundle, tmp_path, {"block_pool.py": lab.solution_dir / "block_pool.py"})
    assert data["score"] == sum(t["max_score"] for t in data["tests"]) > 0


#: The attacks that hang are left to tests/test_grader_hostile.py, which grades them with a short
#: per-test timeout through the same runner: through the bundle each would wait out every test's
#: full limit (10 s, 30 s for the random workloads) and show nothing the checkout's run does not.
HANGS = {"loop_in_method", "loop_on_import", "resource_hog"}
HOSTILE = Path(__file__).resolve().parent / "hostile"
#: The bundle is lab-01's and grades the whole suite: a case for another lab (a ``# lab:`` line)
#: or aimed at a few tests (``# tests:``, graded twice in the checkout) runs in the checkout only.
CASES = sorted(
    p.stem
    for p in HOSTILE.glob("*.py")
    if p.stem not in HANGS and not {"lab", "tests"} & header(p.stem).keys()
)
#: Reading or writing the course, signalling and late writers need the learner to run as another
#: user (the grader as root, as on Gradescope).
NEEDS_ISOLATION = {"read_the_solution", "late_writers", "write_to_the_course", "signal_the_grader"}


@pytest.mark.parametrize("name", CASES)
def test_hostile_submission_gets_its_honest_score(bundle, tmp_path, name):
    """Every attack of tests/hostile/ gets its honest score through the bundle too, and the
    results.json Gradescope reads is the grader's (one left there beforehand never counts)."""
    from tests.test_grader_hostile import LAB, compose, grade

    if name in NEEDS_ISOLATION and sandbox_mode() == "none":
        pytest.skip("graded code runs as your own user here: see docs/grader.md")
    folder = compose(name, tmp_path / "compose")
    results = tmp_path / "root" / "results"
    results.mkdir(parents=True)
    (results / "results.json").write_text(json.dumps({"score": 999, "tests": []}))
    data = run_submission(bundle, tmp_path / "root", {"block_pool.py": folder / "block_pool.py"})
    assert data["tests"] and all(t["name"] != "forged" for t in data["tests"]), data
    if header(name).get("base") == "solution":
        honest = grade(compose(name, tmp_path / "honest", honest=True), timeout=None, first=None)
        want = {r.info.name: r.score for r in honest}
        got = {t["name"]: t["score"] for t in data["tests"]}
        assert got == want, {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        assert LAB.id in data["output"]
    else:
        assert data["score"] == 0, data
    if name == "late_writers":
        import time

        time.sleep(3)
        again = json.loads((results / "results.json").read_text())
        assert again == data, "something rewrote results.json after the grade"


def test_empty_submission_scores_zero_with_a_result(bundle, tmp_path):
    data = run_submission(bundle, tmp_path, {})
    assert data["score"] == 0


def test_a_folder_name_cannot_make_the_copy_follow_a_link(bundle, tmp_path):
    """A red-team helper's submission: a symbolic link ``foo`` to a complete file (the reference,
    which run_autograder had just made root-only; here the solution), and the stub in a folder
    named ``foo\\nbar``. ``find | head -n 1`` gave ``.../foo``, and ``cp`` (as root) copied
    through the link: full marks for an untouched stub. The copy is Python's now, and reads
    regular files only."""
    lab = load_lab("lab-01")
    root = tmp_path / "root"
    submission = root / "submission"
    data_dir = submission / "foo\nbar"
    data_dir.mkdir(parents=True)
    shutil.copy(lab.stub_dir / "block_pool.py", data_dir / "block_pool.py")
    (submission / "foo").symlink_to(lab.solution_dir / "block_pool.py")
    (submission / "block_pool.py").symlink_to(lab.solution_dir / "block_pool.py")
    data = run_submission(bundle, root, {})
    assert data["score"] == 0, f"the stub scored {data['score']}"
