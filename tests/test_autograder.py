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

HOSTILE = Path(__file__).resolve().parent / "hostile"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return build_autograder(load_lab("lab-01"), tmp_path_factory.mktemp("dist"))


def run_submission(bundle: Path, root: Path, files: dict[str, Path]) -> dict:
    """Unpack into root/source, put the files in root/submission, run run_autograder."""
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    for script in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / script, 0o755)
    submission = root / "submission" / "my-work"
    submission.mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, submission / name)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, text=True,
                         capture_output=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_bundle_layout(bundle):
    names = zipfile.ZipFile(bundle).namelist()
    assert {"setup.sh", "run_autograder", "course/pyproject.toml",
            "course/grading/__main__.py", "course/tests/labs/lab_01/lab.json"} <= set(names)
    assert not any(n.startswith("course/solutions") for n in names), "never ship solutions"
    setup = zipfile.ZipFile(bundle).read("setup.sh").decode()
    assert "pip install" in setup and "-e" in setup


def test_stub_scores_zero(bundle, tmp_path):
    lab = load_lab("lab-01")
    data = run_submission(bundle, tmp_path, {"block_pool.py": lab.stub_dir / "block_pool.py"})
    assert data["score"] == 0 and data["tests"]


def test_solution_full_marks(bundle, tmp_path):
    lab = load_lab("lab-01")
    data = run_submission(bundle, tmp_path,
                          {"block_pool.py": lab.solution_dir / "block_pool.py"})
    assert data["score"] == sum(t["max_score"] for t in data["tests"]) > 0


def test_hostile_submission_cannot_forge(bundle, tmp_path):
    data = run_submission(bundle, tmp_path,
                          {"block_pool.py": HOSTILE / "forge_results" / "block_pool.py"})
    assert data["score"] == 0
    assert all(t["name"] != "forged" for t in data["tests"])


def test_empty_submission_scores_zero_with_a_result(bundle, tmp_path):
    data = run_submission(bundle, tmp_path, {})
    assert data["score"] == 0
