"""Stubs, solutions and the reference cannot drift apart."""

from __future__ import annotations

import ast
import inspect

import pytest

from grading.labs import available_labs
from grading.stubs import expected_stubs
from grading.sync import solution_drift

LABS = available_labs()


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_solutions_equal_the_reference(lab):
    assert solution_drift(lab) == []


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
