"""Stubs, solutions and the reference cannot drift apart."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from grading.labs import REPO_ROOT, available_labs
from grading.stubs import expected_stubs
from grading.sync import _as_reference, _read_through, solution_drift

LABS = available_labs()


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_solutions_equal_the_reference(lab):
    assert solution_drift(lab) == []


def test_a_read_through_global_is_written_through_its_module():
    """``NONE_HASH`` is rebound by ``init_none_hash``: the solution reads it as
    ``kv_cache_utils.NONE_HASH`` (sync writes that), and a bare name there is drift."""
    reference = "def f(p):\n    if p is None:\n        p = NONE_HASH  # the seed\n    return p\n"
    read_through = {"NONE_HASH": "kv_cache_utils"}
    (node,) = ast.parse(reference).body
    assert isinstance(node, ast.FunctionDef)
    lines = _read_through(node, reference.splitlines(), read_through)
    assert lines[2] == "        p = kv_cache_utils.NONE_HASH  # the seed"
    (written,) = ast.parse("\n".join(lines)).body
    assert _as_reference(written, read_through) == ast.dump(node)
    assert _as_reference(node, read_through) != ast.dump(node)  # the bare name, in a solution
    for lab in LABS:
        for name, module in lab.read_through.items():
            for filename in lab.files:
                text = (lab.solution_dir / filename).read_text()
                imported = {
                    alias.name
                    for statement in ast.walk(ast.parse(text))
                    if isinstance(statement, ast.ImportFrom)
                    for alias in statement.names
                }
                assert name not in imported, f"{lab.id} {filename} imports {name} by name"
                assert f"{module}.{name}" in text


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_committed_stubs_are_generated_from_the_solutions(lab):
    for path, text in expected_stubs(lab).items():
        assert path.exists(), f"{path} is missing: run `python -m grading stubs`"
        assert path.read_text() == text, f"{path} is stale: run `python -m grading stubs`"


def _signatures(source: str) -> dict[str, str]:
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = ast.dump(item.args)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.dump(node.args)
    return out


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_stub_solution_and_reference_signatures_agree(lab):
    import importlib

    reference: dict[str, str] = {}
    for module in lab.reference:
        reference.update(_signatures(inspect.getsource(importlib.import_module(module))))
    for filename in lab.files:
        stub = _signatures((lab.stub_dir / filename).read_text())
        solution = _signatures((lab.solution_dir / filename).read_text())
        assert stub == solution, f"{lab.id} {filename}: stub and solution signatures differ"
        for name, args in solution.items():
            if name in reference:
                assert args == reference[name], f"{lab.id}: {name} differs from the reference"


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_every_task_names_a_function_of_the_solution(lab):
    for filename, tasks in lab.tasks.items():
        assert filename in lab.files
        stub = (lab.stub_dir / filename).read_text()
        for qualname in tasks:
            assert f'"{lab.id}: {qualname} — ' in stub, f"{qualname} is not stubbed"


# What a learner reads in labs/ and solutions/ speaks to the learner: the tooling that keeps the
# copies in step is the maintainers' business (docs/dev/authoring-labs.md), and a header that
# names it is copied into every stub. The READMEs may name ``solutions/`` (grading the reference
# with ``--impl solutions/...`` is a learner's command); the code files may not.
_MAINTAINER_WORDS = ("test_lab_sync", "grading sync", "grading stubs")


def _learner_files() -> list[Path]:
    return sorted(
        path
        for folder in ("labs", "solutions")
        for path in (REPO_ROOT / folder).rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".md"}
        and "__pycache__" not in path.parts
        and ".bak-" not in path.name
    )


def test_learner_facing_files_do_not_mention_maintainer_tooling():
    files = _learner_files()
    assert any(path.name == "block_pool.py" for path in files), "no lab files found"
    offences = []
    for path in files:
        text = path.read_text()
        words = [word for word in _MAINTAINER_WORDS if word in text]
        if path.suffix == ".py" and "solutions/" in text:
            words.append("solutions/")
        offences += [f"{path.relative_to(REPO_ROOT)}: {word!r}" for word in words]
    assert not offences, (
        "learner-facing files name maintainer tooling (write to the learner: what the file is, "
        "what they write, how it is judged):\n" + "\n".join(offences)
    )


def test_a_drifted_constant_is_reported_and_restored(tmp_path, monkeypatch):
    """Module constants are copies too: a tuned default edited in the solution alone is drift,
    and rewriting it also restores the comment right above it (a constant's why)."""
    import grading.labs
    from grading.labs import load_lab
    from grading.sync import update_solution

    lab = load_lab("lab-04")
    folder = tmp_path / "solutions" / lab.dirname
    folder.mkdir(parents=True)
    original = (lab.solution_dir / lab.files[0]).read_text()
    constant = next(line for line in original.splitlines() if line.startswith("_MAX_SPLITS = "))
    lines = original.splitlines()
    comment = lines[lines.index("_BLOCK_N = 32") - 1]
    assert comment.startswith("# ")
    drifted = original.replace(constant, "_MAX_SPLITS = 3").replace(comment, "# stale reasoning")
    (folder / lab.files[0]).write_text(drifted)
    monkeypatch.setattr(grading.labs, "REPO_ROOT", tmp_path)
    assert [p for p in solution_drift(lab) if "_MAX_SPLITS differs" in p]
    assert update_solution(lab) == [folder / lab.files[0]]
    assert (folder / lab.files[0]).read_text() == original
    assert solution_drift(lab) == []
