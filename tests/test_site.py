"""The course site: it builds with ``mkdocs build --strict``, and the grader's hints land on it.

The build runs into a temporary folder (never the repository's ``build/``), exactly as ``make
site`` does: ``tools/build_site.py`` assembles the docs tree and config, mkdocs builds it with
every link and anchor checked. Then each hint's ``path.md#anchor`` must be a page of the built
site holding an element with that id, since that is where a learner lands from the score table.
The first tests check the assembly rules on a tiny fake repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grading.labs import available_labs  # noqa: E402
from tests.collected import collected_tests  # noqa: E402
from tools.build_site import (  # noqa: E402
    SITE_DIRNAME,
    SRC_DIRNAME,
    Rewriter,
    assemble,
    build_nav,
    course_order,
    site_files,
)

# ----------------------------------------------------------------------------------------------
# Assembly rules, on a fake repository
# ----------------------------------------------------------------------------------------------


def write(root: Path, rel: str, text: str = "# Title\n") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(root, "README.md", "# Course\n[phase](phases/00-a/README.md)\n")
    write(root, "phases/00-a/README.md", "# Phase A\n")
    write(root, "phases/00-a/EXERCISES.md", "# Exercises\n")
    write(root, "phases/00-a/notes.md", "# Extra notes\n")
    write(root, "phases/01-b/CHEATSHEET.md", "# Cheat\n")
    write(root, "labs/lab-01-x/README.md", "# Lab one\n")
    write(root, "labs/lab-01-x/block_pool.py", "")
    write(root, "labs/lab-02-y/stub.py", "")  # no README yet: not in the site
    write(root, "docs/grader.md", "# Grader\n")
    write(root, "docs/zzz.md", "# Zed\n")
    write(root, "docs/figures/f.png", "png")
    write(root, "mini_vllm/core/block_pool.py", "")
    return root


def test_files_copied_and_readme_becomes_index(fake_repo: Path) -> None:
    files = site_files(fake_repo)
    assert files["README.md"] == "index.md"
    assert "labs/lab-01-x/README.md" in files
    assert "labs/lab-01-x/block_pool.py" not in files
    assert "docs/figures/f.png" in files
    assert not any(rel.startswith("mini_vllm") for rel in files)


def test_nav_in_course_order_with_only_existing_pages(fake_repo: Path) -> None:
    nav = build_nav(site_files(fake_repo), fake_repo)
    assert nav == [
        {"Home": "index.md"},
        {
            "00 · The KV cache": [
                {"Guide": "phases/00-a/README.md"},
                {"Exercises": "phases/00-a/EXERCISES.md"},
                {"Extra notes": "phases/00-a/notes.md"},
            ]
        },
        {"01 · Engine tour": [{"Cheat sheet": "phases/01-b/CHEATSHEET.md"}]},
        {"Labs": [{"Lab one": "labs/lab-01-x/README.md"}]},
        {"Reference": [{"The grader": "docs/grader.md"}, {"Zed": "docs/zzz.md"}]},
    ]


def test_labs_sit_inside_their_phase_in_table_order(fake_repo: Path) -> None:
    write(
        fake_repo,
        "README.md",
        """\
        # Course
        ## The course
        | phase | lab |
        |---|---|
        | [A](phases/00-a/README.md) | [2](labs/lab-02-y/README.md) · [1](labs/lab-01-x/README.md) |
        ## Elsewhere
        | [B](phases/01-b/README.md) | [one](labs/lab-01-x/README.md) |
        """,
    )
    write(fake_repo, "labs/lab-02-y/README.md", "# Lab two\n")
    write(fake_repo, "docs/pictures.md", "# Pictures\n")
    assert course_order(fake_repo) == [("00-a", ["lab-02-y", "lab-01-x"])]
    nav = build_nav(site_files(fake_repo), fake_repo)
    assert nav[1] == {"Pictures": [{"Pictures": "docs/pictures.md"}]}
    assert nav[2] == {
        "00 · The KV cache": [
            {"Guide": "phases/00-a/README.md"},
            {"Lab two": "labs/lab-02-y/README.md"},
            {"Lab one": "labs/lab-01-x/README.md"},
            {"Exercises": "phases/00-a/EXERCISES.md"},
            {"Extra notes": "phases/00-a/notes.md"},
        ]
    }
    assert not any("Labs" in item for item in nav)


@pytest.mark.parametrize(
    ("source", "text", "expected"),
    [
        # a copied page, seen from another folder: re-pointed, anchor kept
        (
            "phases/00-a/README.md",
            "[lab](../../labs/lab-01-x/README.md#step-1)",
            "[lab](../../labs/lab-01-x/README.md#step-1)",
        ),
        # the root README is index.md in the site
        ("phases/00-a/README.md", "[home](../../README.md)", "[home](../../index.md)"),
        # a folder with a README in the site: its README
        ("README.md", "[phase](phases/00-a/)", "[phase](phases/00-a/README.md)"),
        # a source file: its path, once
        (
            "labs/lab-01-x/README.md",
            "[block_pool.py](block_pool.py)",
            "`labs/lab-01-x/block_pool.py`",
        ),
        (
            "labs/lab-01-x/README.md",
            "[the reference](../../mini_vllm/core/block_pool.py#L3)",
            "the reference (`mini_vllm/core/block_pool.py`)",
        ),
        # a folder without a page, outside the repository, a page not written yet
        ("README.md", "[`mini_vllm/`](mini_vllm/)", "`mini_vllm/`"),
        ("README.md", "[the design](../shared/DESIGN.md)", "the design (`../shared/DESIGN.md`)"),
        ("README.md", "[phase 03](phases/03-c/README.md)", "phase 03 (`phases/03-c/README.md`)"),
        # untouched: URLs, same-page anchors, images in the site, link text over two lines
        (
            "README.md",
            "[vLLM](https://github.com/vllm-project/vllm)",
            "[vLLM](https://github.com/vllm-project/vllm)",
        ),
        ("README.md", "[below](#below)", "[below](#below)"),
        ("docs/grader.md", "![plot](figures/f.png)", "![plot](figures/f.png)"),
        ("README.md", "[the\nguide](phases/00-a/README.md)", "[the\nguide](phases/00-a/README.md)"),
    ],
)
def test_links_are_made_site_safe(fake_repo: Path, source: str, text: str, expected: str) -> None:
    rewriter = Rewriter(site_files(fake_repo), fake_repo)
    assert rewriter.page(text + "\n", source) == expected + "\n"


def test_code_is_never_rewritten(fake_repo: Path) -> None:
    text = textwrap.dedent(
        """\
        Run `[x](block_pool.py)` as is.

        ```markdown
        [stub](block_pool.py)
        ```
        """
    )
    rewriter = Rewriter(site_files(fake_repo), fake_repo)
    assert rewriter.page(text, "labs/lab-01-x/README.md") == text


def test_assembly_is_idempotent_and_drops_stale_files(fake_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    first = assemble(out, fake_repo)
    assert first.written == len(site_files(fake_repo))
    stale = out / SRC_DIRNAME / "phases" / "gone.md"
    stale.write_text("# gone\n")
    second = assemble(out, fake_repo)
    assert second.written == 0 and second.removed == 1 and not stale.exists()
    config = (out / "mkdocs.generated.yml").read_text()
    assert "INHERIT:" in config and '"Guide": "phases/00-a/README.md"' in config


# ----------------------------------------------------------------------------------------------
# The real site
# ----------------------------------------------------------------------------------------------


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def html_ids(path: Path) -> set[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser.ids


def html_page(site: Path, site_md: str) -> Path:
    """Where mkdocs (directory URLs) writes the page built from ``site_md``."""
    md = Path(site_md)
    if md.name in ("index.md", "README.md"):
        return site / md.parent / "index.html"
    return site / md.parent / md.stem / "index.html"


LABS = available_labs()


@pytest.fixture(scope="module")
def hints() -> Iterator[dict[str, Future]]:
    """Every lab's graded tests as the grader collects them: child processes, started at once.

    Collecting a suite takes seconds (a child imports pytest, hypothesis and the suite), so all
    labs are collected in parallel, and ``built_site`` starts them before running mkdocs.
    """
    with ThreadPoolExecutor(max_workers=max(1, len(LABS))) as pool:
        yield {lab.id: pool.submit(collected_tests, lab.id) for lab in LABS}


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory, hints: dict[str, Future]) -> Path:
    out = tmp_path_factory.mktemp("course-site")
    report = assemble(out)
    assert report.config is not None
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(report.config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (a broken link or anchor in the pages listed below):\n"
        + proc.stdout[-4000:]
        + proc.stderr[-4000:]
    )
    return out / SITE_DIRNAME


def test_site_builds_strictly(built_site: Path) -> None:
    assert (built_site / "index.html").is_file()
    assert (built_site / "search" / "search_index.json").is_file()
    for site_md in site_files().values():
        if site_md.endswith(".md"):
            assert html_page(built_site, site_md).is_file(), f"{site_md} was not built"


def test_every_page_is_in_the_navigation() -> None:
    def pages(items: list) -> set[str]:
        found: set[str] = set()
        for item in items:
            for value in item.values():
                found |= pages(value) if isinstance(value, list) else {value}
        return found

    files = site_files()
    in_nav = pages(build_nav(files))
    orphans = sorted(s for s in files.values() if s.endswith(".md") and s not in in_nav)
    assert not orphans, f"pages missing from the navigation: {orphans}"


@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_hint_links_land_on_a_heading_of_the_site(lab, hints, built_site: Path) -> None:
    files = site_files()
    html_cache: dict[Path, set[str]] = {}
    missing = []
    for info in hints[lab.id].result():
        page, _, anchor = info.doc.partition("#")
        if page not in files:
            missing.append(f"{info.name}: {page} is not a page of the site")
            continue
        html = html_page(built_site, files[page])
        if html not in html_cache:
            html_cache[html] = html_ids(html) if html.is_file() else set()
        if anchor and anchor not in html_cache[html]:
            missing.append(f"{info.name}: {html.relative_to(built_site)} has no id {anchor!r}")
    assert not missing, "\n".join(missing)


# ----------------------------------------------------------------------------------------------
# One lab order: the README's course table, the phase pages, the lab READMEs and the sidebar
# ----------------------------------------------------------------------------------------------

ORDER = course_order()
SEQUENCE = [(phase, lab) for phase, labs in ORDER for lab in labs]


def _intro(text: str) -> str:
    """A page's opening: everything before its first ``##`` heading."""
    return text.split("\n## ", 1)[0]


def test_course_table_names_every_lab_once() -> None:
    assert ORDER, "README.md has no course table under '## The course'"
    labs = [lab for _, lab in SEQUENCE]
    assert len(labs) == len(set(labs)), f"a lab sits in two phases: {labs}"
    with_readme = sorted(p.parent.name for p in (ROOT / "labs").glob("*/README.md"))
    missing = sorted(set(with_readme) - set(labs))
    assert not missing, f"labs missing from README.md's course table: {missing}"
    for phase, _ in ORDER:
        assert (ROOT / "phases" / phase / "README.md").is_file(), phase


@pytest.mark.parametrize(("phase", "labs"), ORDER, ids=[phase for phase, _ in ORDER])
def test_phase_page_opens_with_its_labs_in_order(phase: str, labs: list[str]) -> None:
    intro = _intro((ROOT / "phases" / phase / "README.md").read_text(encoding="utf-8"))
    positions = []
    for lab in labs:
        link = f"labs/{lab}/README.md"
        assert link in intro, f"phases/{phase}/README.md: its opening does not link {lab}"
        positions.append(intro.index(link))
    assert positions == sorted(positions), (
        f"phases/{phase}/README.md: its labs are not introduced in the course order {labs}"
    )


@pytest.mark.parametrize("index", range(len(SEQUENCE)), ids=[lab for _, lab in SEQUENCE])
def test_lab_readme_names_its_place_in_the_course(index: int) -> None:
    phase, lab = SEQUENCE[index]
    readme = ROOT / "labs" / lab / "README.md"
    head = readme.read_text(encoding="utf-8").split("\n\n", 2)
    line = next((block for block in head[:2] if "**In the course:**" in block), None)
    assert line, f"{readme}: say '**In the course:** [phase NN](...), after ...; next ...' on top"
    line = line[line.index("**In the course:**") :].split("\n*")[0]
    assert f"phases/{phase}/README.md" in line, f"{readme}: its phase is {phase}"
    if index:
        before = SEQUENCE[index - 1][1]
        assert f"after [{before[:6].rstrip('-')}" in line or f"../{before}/README.md" in line, (
            f"{readme}: the lab before it is {before}"
        )
    if "next [" in line:
        assert index + 1 < len(SEQUENCE), f"{readme}: names a next lab, but it is the last"
        after = SEQUENCE[index + 1][1]
        assert f"next [{'-'.join(after.split('-')[:2])}](../{after}/README.md)" in line, (
            f"{readme}: the lab after it is {after}"
        )


def test_sidebar_lists_labs_inside_their_phase_in_order() -> None:
    nav = build_nav(site_files())
    sections = {key: value for item in nav for key, value in item.items()}
    for phase, labs in ORDER:
        section = next(v for k, v in sections.items() if k.startswith(phase[:2] + " "))
        pages = [value for entry in section for value in entry.values()]
        in_section = [p.split("/")[1] for p in pages if p.startswith("labs/")]
        assert in_section == labs, f"sidebar of phase {phase}: {in_section}, expected {labs}"
