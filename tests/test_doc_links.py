"""Every hint's doc link resolves: the file exists and the anchor is one of its headings."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from grading.labs import available_labs
from tests.collected import collected_tests

REPO = Path(__file__).resolve().parent.parent


def slugify(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc extension) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    found, in_code = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.add(slugify(m.group(1)))
    return found


def test_slugify_matches_mkdocs():
    assert slugify("The free block queue") == "the-free-block-queue"
    assert slugify("Why a hand-written linked list?") == "why-a-hand-written-linked-list"
    assert slugify("Invariants I1–I4") == "invariants-i1i4"


LABS = available_labs()


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_hint_links_resolve(lab):
    missing = []
    for info in collected_tests(lab.id):
        page, _, anchor = info.doc.partition("#")
        path = REPO / page
        if not path.exists():
            missing.append(f"{info.name}: {page} does not exist")
        elif anchor not in anchors(path):
            missing.append(f"{info.name}: {page} has no heading for #{anchor}")
    assert not missing, "\n".join(missing)


def test_lab_readmes_start_with_files_and_command():
    for lab in LABS:
        readme = lab.stub_dir / "README.md"
        assert readme.exists(), f"{readme} is missing"
        head = "\n".join(readme.read_text().splitlines()[:25])
        assert f"make {lab.id}" in head, f"{readme}: say the command to run near the top"
        for filename in lab.files:
            assert filename in head, f"{readme}: name {filename} near the top"


def lab_file_claims(text: str) -> list[tuple[str, str]]:
    """``(lab folder, file)`` for each lab link followed closely by a backticked ``.py`` name.

    The course table and the phase pages write "[lab-09](…/README.md) `model_inputs.py`" or
    "(`make lab-09`, `model_inputs.py`: …)"; the name is the file a learner is told to edit.
    """
    text = re.sub(r"\n>\s?", "\n", text)
    claims = []
    for link in re.finditer(r"\]\((?:\.\./)*labs/([\w-]+)/README\.md\)", text):
        after = text[link.end() : link.end() + 60].split("[")[0]
        if named := re.search(r"`(?:labs/[\w-]+/)?(\w+\.py)`", after):
            claims.append((link.group(1), named.group(1)))
    return claims


def test_lab_links_name_the_labs_own_files():
    """A page that names the file of a lab next to its link names one the lab has."""
    assert lab_file_claims("[lab-09](labs/lab-09-engine/README.md) `model_runner.py` ·") == [
        ("lab-09-engine", "model_runner.py")
    ]
    files = {lab.stub_dir.name: set(lab.files) for lab in LABS}
    pages = [REPO / "README.md", *sorted(REPO.glob("phases/*/README.md"))]
    pages += sorted(REPO.glob("docs/*.md")) + sorted(REPO.glob("labs/*/README.md"))
    wrong = [
        f"{page.relative_to(REPO)}: {folder} has no {name} (its files: {sorted(files[folder])})"
        for page in pages
        for folder, name in lab_file_claims(page.read_text())
        if folder in files and name not in files[folder]
    ]
    assert len(lab_file_claims((REPO / "README.md").read_text())) >= len(LABS) - 1
    assert not wrong, "\n".join(wrong)
