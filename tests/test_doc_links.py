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
