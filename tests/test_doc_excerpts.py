"""Code excerpts in the guides are mini-vLLM's current code, never a stale copy.

The deep dives show short excerpts of mini-vLLM's own code beside their upstream citations, so
that they read without ``upstream/`` open. An excerpt is a fenced block whose info string names
its source and symbol::

    ```python title="mini_vllm/core/block_pool.py · BlockPool.touch"
    for block in blocks:
        if block.ref_cnt == 0:
            self.free_block_queue.remove(block)
        block.ref_cnt += 1
    ```

Rules:

* the title is ``<path under the repository> · <Qualified.name>``; the symbol must exist in
  that file, and every line of the excerpt must lie inside it;
* the excerpt is cut into chunks at elision lines (a line that is only ``...``, or only
  ``# ...``); each chunk must appear verbatim in the symbol's source, as consecutive lines,
  dedented by any common indentation; the chunks must come in source order;
* mini-vLLM is never cited with a line number (``mini_vllm/x.py:123``): those rot with every
  edit, and the excerpts now say what the line numbers pointed at.

A failure names the page, the line of the fence, the excerpt's title, and the first line that
no longer matches, so whoever edited ``mini_vllm`` knows which excerpt to refresh.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Where excerpts may be: every Markdown page of the course.
_SCAN = ("phases", "labs", "docs", "notebooks")
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_TITLE = re.compile(r'title="(?P<path>[\w./-]+\.py)\s*·\s*(?P<symbol>[A-Za-z_][\w.]*)"')
_ELISION = re.compile(r"^\s*(?:#\s*)?(?:\.\.\.|…)\s*$")


@dataclass(frozen=True)
class Excerpt:
    """One fenced excerpt of a page: where it is, what it claims to show, and its lines."""

    page: Path
    line: int  # the fence's line in the page, 1-based
    path: str  # the source file, relative to the repository
    symbol: str  # Class.method or function
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        try:
            return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"
        except ValueError:
            return f"{self.page.name}:{self.line}"

    @property
    def id(self) -> str:
        return f"{self.page.parent.name}/{self.page.name}:{self.line}:{self.symbol}"


def doc_pages(root: Path) -> list[Path]:
    pages = [root / "README.md"]
    for folder in _SCAN:
        pages += sorted((root / folder).rglob("*.md")) if (root / folder).is_dir() else []
    return [p for p in pages if p.is_file() and ".venv" not in p.parts]


def find_excerpts(page: Path, root: Path) -> list[Excerpt]:
    """The excerpts of ``page``: fenced blocks titled ``<path>.py · <symbol>``."""
    found: list[Excerpt] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening.group("fence"), opening.group("indent")
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        title = _TITLE.search(opening.group("info"))
        if title:
            body = tuple(line[len(indent) :] for line in lines[i + 1 : end])
            found.append(Excerpt(page, i + 1, title.group("path"), title.group("symbol"), body))
        i = end + 1
    return found


def _symbol_lines(source: str, symbol: str) -> list[str] | None:
    """The source lines of ``symbol`` (``Class.method`` or a function), or None if absent."""
    body: list[ast.stmt] = ast.parse(source).body
    node: ast.AST | None = None
    for part in symbol.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    assert node is not None
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return source.splitlines()[first - 1 : node.end_lineno]


def _chunks(lines: tuple[str, ...]) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    for line in lines:
        if _ELISION.match(line):
            chunks.append([])
        else:
            chunks[-1].append(line)
    chunks = [c for c in chunks if any(line.strip() for line in c)]
    return [textwrap.dedent("\n".join(c)).splitlines() for c in chunks]


def _find(chunk: list[str], source: list[str], start: int) -> int | None:
    """First index >= start where ``chunk`` matches ``source`` under one common indentation."""
    for i in range(start, len(source) - len(chunk) + 1):
        first = source[i]
        if not first.endswith(chunk[0]) or first[: len(first) - len(chunk[0])].strip():
            continue
        pad = first[: len(first) - len(chunk[0])]
        if all(
            (source[i + j] == pad + want) if want else not source[i + j].strip()
            for j, want in enumerate(chunk)
        ):
            return i
    return None


def check_excerpt(excerpt: Excerpt, root: Path) -> str | None:
    """None if the excerpt is current; else a message naming it and what no longer matches."""
    head = f"{excerpt.where}: the excerpt of {excerpt.symbol} ({excerpt.path})"
    path = root / excerpt.path
    if not path.is_file():
        return f"{head}: {excerpt.path} does not exist"
    source = _symbol_lines(path.read_text(encoding="utf-8"), excerpt.symbol)
    if source is None:
        return f"{head}: {excerpt.path} defines no {excerpt.symbol}"
    chunks = _chunks(excerpt.lines)
    if not chunks:
        return f"{head} is empty"
    position = 0
    for chunk in chunks:
        found = _find(chunk, source, position)
        if found is not None:
            position = found + len(chunk)
            continue
        if _find(chunk, source, 0) is not None:
            return f"{head}: its parts are out of source order at {chunk[0].strip()!r}"
        # Name the first line that is not in the symbol any more, the most useful clue.
        stripped = {line.strip() for line in source}
        missing = next((line for line in chunk if line.strip() not in stripped), None)
        if missing is not None:
            return (
                f"{head} no longer matches the source: {missing.strip()!r} is not in "
                f"{excerpt.symbol}; copy the current lines from {excerpt.path}"
            )
        return (
            f"{head} no longer matches the source: the lines from {chunk[0].strip()!r} are not "
            f"consecutive in {excerpt.symbol} any more; copy them again from {excerpt.path}"
        )
    return None


PAGES = doc_pages(ROOT)
EXCERPTS: list[Excerpt] = [e for page in PAGES for e in find_excerpts(page, ROOT)]


def test_the_deep_dives_show_excerpts() -> None:
    """The key paths of the course each have at least one excerpt somewhere in the guides."""
    shown = {e.symbol for e in EXCERPTS}
    for symbol in (
        "BlockPool.get_new_blocks",
        "BlockPool.touch",
        "BlockPool.free_blocks",
        "hash_block_tokens",
        "KVCacheManager.allocate_slots",
        "Scheduler.schedule",
    ):
        assert symbol in shown, f"no excerpt of {symbol} in the guides"


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=[e.id for e in EXCERPTS])
def test_excerpt_matches_the_source(excerpt: Excerpt) -> None:
    problem = check_excerpt(excerpt, ROOT)
    assert problem is None, problem


_LINE_CITATION = re.compile(r"(?<![\w./-])mini_vllm/(?:[\w-]+/)*\w+\.py:\d+")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_no_line_numbers_into_mini_vllm(page: Path) -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for m in _LINE_CITATION.finditer(line)
    ]
    assert not found, (
        "cite mini-vLLM by file and name (or show an excerpt), not by line number:\n"
        + "\n".join(found)
    )


# ----------------------------------------------------------------------------------------------
# The checker itself, on made-up sources: it must fail where a reader would be misled.
# ----------------------------------------------------------------------------------------------

SOURCE = '''\
class Pool:
    def touch(self, blocks):
        """Doc."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.queue.remove(block)
            block.ref_cnt += 1

    def other(self):
        return 1
'''


def _excerpt(tmp_path: Path, body: str, symbol: str = "Pool.touch") -> Excerpt:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "pool.py").write_text(SOURCE)
    page = tmp_path / "page.md"
    page.write_text(f'```python title="pkg/pool.py · {symbol}"\n{body}```\n')
    (excerpt,) = find_excerpts(page, tmp_path)
    return excerpt


@pytest.mark.parametrize(
    "body",
    [
        "for block in blocks:\n    if block.ref_cnt == 0:\n        self.queue.remove(block)\n",
        "def touch(self, blocks):\n    ...\n    for block in blocks:\n",
        "for block in blocks:\n    # ...\n    block.ref_cnt += 1\n",
    ],
)
def test_checker_accepts_verbatim_chunks(tmp_path: Path, body: str) -> None:
    assert check_excerpt(_excerpt(tmp_path, body), tmp_path) is None


@pytest.mark.parametrize(
    ("body", "symbol", "expected"),
    [
        ("block.ref_cnt += 2\n", "Pool.touch", "block.ref_cnt += 2"),  # edited code
        ("block.ref_cnt += 1\n    ...\nfor block in blocks:\n", "Pool.touch", "order"),
        ("return 1\n", "Pool.touch", "return 1"),  # real code, but not in this symbol
        ("return 1\n", "Pool.gone", "Pool.gone"),  # the symbol was renamed
    ],
)
def test_checker_names_what_no_longer_matches(
    tmp_path: Path, body: str, symbol: str, expected: str
) -> None:
    problem = check_excerpt(_excerpt(tmp_path, body, symbol), tmp_path)
    assert problem is not None and expected in problem
    assert "page.md:1" in problem and symbol in problem
