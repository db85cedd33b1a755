"""Check that every upstream citation in the course points at the right line of vLLM v0.22.1.

The course cites upstream as ``vllm/<path>.py:<line>`` (or a range ``:<start>-<end>``), always
next to the backticked name of the symbol it means. Line numbers rot silently when text is
edited or copied, so this tool resolves the named symbol in the pinned sdist with :mod:`ast` and
compares. ``docs/citations.md`` is the writers' guide; the rules, in short:

* A *single line* (``vllm/v1/core/block_pool.py:130``) must be the line that defines the symbol:
  the ``class``/``def`` line (not a decorator), or the first line of a module- or class-level
  assignment. Overloads and property setters define a name more than once; any of them counts.
* A *range* (``vllm/v1/core/block_pool.py:312-337``) cites a passage: it must lie within the
  symbol's span (its decorators through its last line).
* The symbol is the backticked identifier on the same line nearest to the citation (a tie goes to
  the one before it) among those defined in the cited file; failing that, the nearest on the
  line before, then on the line after (a wrapped sentence; never across a blank line).
  ``Class.method``, nested names, a unique bare method name, and a trailing ``()`` are
  understood. Backticked words that the file does not define (``ref_cnt``, ``None``) are
  passed over.
* A backticked ``:164`` right after a citation reuses the path of the previous citation on the
  line (as in "``vllm/v1/core/kv_cache_utils.py:116`` is ``KVCacheBlock``, ``:164``
  ``FreeKVCacheBlockQueue``").
* A path without a line must exist at the pin. Paths may also be written from the sdist root as
  ``upstream/vllm-0.22.1/<path>.py:<line>``, which is how upstream's tests are cited.
* Lines between ``citation-check: off`` and ``citation-check: on`` (in any comment) are skipped,
  for examples of wrong citations.
* Native sources (``csrc/attention/attention_kernels.cuh:85``; ``.cu``, ``.cuh``, ``.h``,
  ``.hpp``, ``.cpp``, ``.cc``, ``.c``) have no :mod:`ast` here, so they are checked by text: the
  cited line (or range) must contain the backticked text nearest to the citation, found as for
  Python (``paged_attention_kernel`` for its definition line, ``dim3 grid(num_heads, num_seqs,
  1)`` for a statement), whitespace aside. A native citation with no backticked text near it is
  wrong: say what the line holds.

Run ``python tools/check_citations.py`` to list every citation with its status (exit status 1 if
any is wrong); ``tests/test_citations.py`` runs the same check under ``make test``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.fetch_upstream import ROOT, TREE_NAME, UpstreamError, ensure_upstream
from tools.upstream_symbols import Ambiguous, Definition, SymbolIndex

# Where citations are looked for, relative to the repository root.
SCAN_DIRS: tuple[str, ...] = ("phases", "labs", "docs")
SCAN_FILES: tuple[str, ...] = ("README.md", "UPSTREAM_PIN.md")
SCAN_SUFFIXES: frozenset[str] = frozenset({".md", ".py"})

_TREE_PREFIX = f"upstream/{TREE_NAME}/"
# A citation: an upstream path, optionally ``:line`` or ``:start-end``. The look-behind keeps
# ``mini_vllm/core/x.py`` and ``foo/vllm/x.py`` from matching.
NATIVE_SUFFIXES = ("cu", "cuh", "hpp", "cpp", "cc", "h", "c")
_NATIVE = rf"csrc/(?:[\w-]+/)*[\w-]+\.(?:{'|'.join(NATIVE_SUFFIXES)})"
CITATION_RE = re.compile(
    r"(?<![\w./-])"
    rf"(?P<path>{re.escape(_TREE_PREFIX)}(?:[\w-]+/)*\w+\.py|vllm/(?:[\w-]+/)*\w+\.py"
    rf"|(?:{re.escape(_TREE_PREFIX)})?{_NATIVE})"
    r"(?::(?P<start>\d+)(?:[-–](?P<end>\d+))?)?"
    r"(?![\w.-])"
)
# A backtick span: a run of backticks, text, the same run (Markdown and reST ``double``).
BACKTICK_RE = re.compile(r"(?<!`)(?P<ticks>`+)(?!`)(?P<body>.+?)(?<!`)(?P=ticks)(?!`)")
SHORTHAND_RE = re.compile(r"^:(?P<start>\d+)(?:[-–](?P<end>\d+))?$")
IDENT_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(.*\))?$")
TOGGLE_OFF = "citation-check: off"
TOGGLE_ON = "citation-check: on"


# --------------------------------------------------------------------------------------------
# Citations in the course
# --------------------------------------------------------------------------------------------


@dataclass
class Citation:
    """One citation found in the course, and its verdict after :meth:`Checker.check`."""

    source: Path  # the course file, relative to the repository root when inside it
    line_no: int  # 1-based line in ``source``
    path: str  # upstream path from the sdist root, e.g. vllm/v1/core/block_pool.py
    start: int | None  # cited line (None: the path alone)
    end: int | None  # end of a cited range
    candidates: list[str] = field(default_factory=list)  # backticked names, nearest first
    snippets: list[str] = field(default_factory=list)  # any backticked text, nearest first
    symbol: str | None = None
    ok: bool = False
    status: str = "unchecked"
    message: str = ""

    @property
    def where(self) -> str:
        """``course_file:line``, as in compiler messages."""
        return f"{self.source}:{self.line_no}"

    @property
    def cited(self) -> str:
        """The citation as written (normalised to the sdist root)."""
        if self.start is None:
            return self.path
        if self.end is None:
            return f"{self.path}:{self.start}"
        return f"{self.path}:{self.start}-{self.end}"


def _spans(line: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group("body").strip()) for m in BACKTICK_RE.finditer(line)]


def _distance(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Gap between two character spans; ties prefer a span before ``b`` (second key 0)."""
    if a[1] <= b[0]:
        return b[0] - a[1], 0
    if b[1] <= a[0]:
        return a[0] - b[1], 1
    return 0, 0


def _identifiers(spans: list[tuple[int, int, str]]) -> list[tuple[tuple[int, int], str]]:
    """The backticked identifiers among a line's spans (citations excluded)."""
    found: list[tuple[tuple[int, int], str]] = []
    for s_start, s_end, body in spans:
        if CITATION_RE.search(body) or SHORTHAND_RE.match(body):
            continue
        ident = IDENT_RE.match(body)
        if ident:
            found.append(((s_start, s_end), ident.group("name")))
    return found


def _snippets(spans: list[tuple[int, int, str]]) -> list[tuple[tuple[int, int], str]]:
    """The backticked texts of a line that are not citations (native sources match on these)."""
    return [
        ((s_start, s_end), body)
        for s_start, s_end, body in spans
        if body and not CITATION_RE.search(body) and not SHORTHAND_RE.match(body)
    ]


def _citations_on(
    line: str, spans: list[tuple[int, int, str]], source: Path, line_no: int
) -> list[tuple[tuple[int, int], Citation]]:
    """The citations of one line, with their character spans (shorthands resolved)."""
    found: list[tuple[tuple[int, int], Citation]] = []
    for match in CITATION_RE.finditer(line):
        path = match.group("path").removeprefix(_TREE_PREFIX)
        start = int(match.group("start")) if match.group("start") else None
        end = int(match.group("end")) if match.group("end") else None
        found.append(((match.start(), match.end()), Citation(source, line_no, path, start, end)))
    # Shorthand ``:164``: the path of the nearest citation before it on the line.
    for s_start, s_end, body in spans:
        short = SHORTHAND_RE.match(body)
        if not short:
            continue
        before = [(pos, c) for (pos, c) in found if pos[1] <= s_start]
        if not before:
            continue  # no path earlier on the line: not a citation
        previous = max(before, key=lambda item: item[0][0])[1]
        start = int(short.group("start"))
        end = int(short.group("end")) if short.group("end") else None
        found.append(((s_start, s_end), Citation(source, line_no, previous.path, start, end)))
    return found


def extract(text: str, source: Path) -> list[Citation]:
    """Find the citations of one course file (see the module docstring for the syntax).

    Candidate symbols are the backticked identifiers of the citation's line, nearest first,
    then those of the line before (from its end) and of the line after (from its start), so a
    sentence wrapped between the symbol and its citation still resolves; blank lines (paragraph
    breaks) and ``citation-check: off`` regions are never crossed.
    """
    lines = text.splitlines()
    checked: list[bool] = []
    checking = True
    for line in lines:
        if TOGGLE_OFF in line:
            checking = False
        elif TOGGLE_ON in line:
            checking = True
            checked.append(False)
            continue
        checked.append(checking and TOGGLE_OFF not in line)
    spans = [_spans(line) if ok else [] for line, ok in zip(lines, checked)]
    idents = [_identifiers(line_spans) for line_spans in spans]
    texts = [_snippets(line_spans) for line_spans in spans]

    def neighbour(index: int, table=idents) -> list[tuple[tuple[int, int], str]]:
        if 0 <= index < len(lines) and checked[index] and lines[index].strip():
            return table[index]
        return []

    citations: list[Citation] = []
    for index, line in enumerate(lines):
        if not checked[index]:
            continue
        for pos, citation in _citations_on(line, spans[index], source, index + 1):
            same = sorted(idents[index], key=lambda item: _distance(item[0], pos))
            before = sorted(neighbour(index - 1), key=lambda item: -item[0][1])
            after = sorted(neighbour(index + 1), key=lambda item: item[0][0])
            citation.candidates = [name for _, name in [*same, *before, *after]]
            same = sorted(texts[index], key=lambda item: _distance(item[0], pos))
            before = sorted(neighbour(index - 1, texts), key=lambda item: -item[0][1])
            after = sorted(neighbour(index + 1, texts), key=lambda item: item[0][0])
            citation.snippets = [text for _, text in [*same, *before, *after]]
            citations.append(citation)
    return citations


class Checker:
    """Checks citations against an unpacked upstream tree."""

    def __init__(self, upstream: Path) -> None:
        self.upstream = upstream

    def check(self, citation: Citation) -> Citation:
        """Fill in ``citation``'s verdict (``ok``, ``status``, ``message``) and return it."""
        target = self.upstream / citation.path
        head = f"{citation.where} cites {citation.cited}"
        if not target.is_file():
            return _verdict(citation, False, "missing-file", f"{head}: no such file at the pin")
        if citation.start is None:
            return _verdict(citation, True, "file", "file exists")
        if not citation.path.endswith(".py"):
            return self._check_native(citation, target, head)
        index = SymbolIndex.for_file(target)
        last_cited = citation.end if citation.end is not None else citation.start
        if citation.end is not None and citation.end < citation.start:
            return _verdict(
                citation, False, "bad-range", f"{head}: the range ends before it starts"
            )
        if citation.start < 1 or last_cited > index.num_lines:
            return _verdict(
                citation,
                False,
                "past-eof",
                f"{head}, but the file has {index.num_lines} lines",
            )
        chosen: tuple[str, list[Definition]] | None = None
        for name in citation.candidates:
            try:
                definitions = index.lookup(name)
            except Ambiguous as exc:
                return _verdict(
                    citation,
                    False,
                    "ambiguous",
                    f"{head} for {name}, which names several definitions there: "
                    f"{', '.join(exc.candidates)}; write the qualified name",
                )
            if definitions:
                chosen = (name, definitions)
                break
        if chosen is None:
            inside = index.innermost(citation.start)
            hint = f"; line {citation.start} is inside {inside.qualname}" if inside else ""
            named = ", ".join(f"`{n}`" for n in citation.candidates) or "none"
            return _verdict(
                citation,
                False,
                "no-symbol",
                f"{head} but names no symbol defined there (backticked names on the line: "
                f"{named}){hint}",
            )
        name, definitions = chosen
        citation.symbol = name
        main = definitions[-1]
        if citation.end is None:
            if any(d.line == citation.start for d in definitions):
                return _verdict(citation, True, "ok", f"{name} is defined there")
            lines = " or ".join(f":{d.line}" for d in definitions)
            return _verdict(
                citation,
                False,
                "wrong-line",
                f"{head} for {name}, which is defined at {lines}",
            )
        if any(d.first <= citation.start and citation.end <= d.last for d in definitions):
            return _verdict(citation, True, "ok", f"within {name}")
        return _verdict(
            citation,
            False,
            "out-of-span",
            f"{head} for {name}, which spans :{main.first}-{main.last}",
        )

    def _check_native(self, citation: Citation, target: Path, head: str) -> Citation:
        """A C++/CUDA citation: the cited lines must hold the nearest backticked text."""
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
        end = citation.end if citation.end is not None else citation.start
        if end < citation.start:
            return _verdict(
                citation, False, "bad-range", f"{head}: the range ends before it starts"
            )
        if citation.start < 1 or end > len(lines):
            return _verdict(
                citation, False, "past-eof", f"{head}, but the file has {len(lines)} lines"
            )
        if not citation.snippets:
            return _verdict(
                citation,
                False,
                "no-symbol",
                f"{head} with no backticked text near it: name what the cited line holds",
            )
        cited = _squash(" ".join(lines[citation.start - 1 : end]))
        for snippet in citation.snippets:
            if _squash(snippet) in cited:
                citation.symbol = snippet
                return _verdict(citation, True, "ok", f"`{snippet}` is there")
        want = citation.snippets[0]
        found = [n for n, line in enumerate(lines, 1) if _squash(want) in _squash(line)]
        where = f"; `{want}` is at :{', :'.join(map(str, found[:5]))}" if found else ""
        return _verdict(
            citation,
            False,
            "wrong-line",
            f"{head}, whose text holds none of "
            f"{', '.join(f'`{t}`' for t in citation.snippets[:3])}{where}",
        )


def _squash(text: str) -> str:
    """Text with all whitespace removed, so that line breaks and indentation never matter."""
    return re.sub(r"\s+", "", text)


def _verdict(citation: Citation, ok: bool, status: str, message: str) -> Citation:
    citation.ok, citation.status, citation.message = ok, status, message
    return citation


def course_files(root: Path = ROOT) -> list[Path]:
    """The files whose citations are checked: README, the pin page, phases/, labs/, docs/."""
    files = [root / name for name in SCAN_FILES if (root / name).is_file()]
    for folder in SCAN_DIRS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel_parts = path.relative_to(base).parts
            if any(part.startswith(".") or part == "__pycache__" for part in rel_parts):
                continue
            if path.is_file() and path.suffix in SCAN_SUFFIXES:
                files.append(path)
    return files


def check_files(files: Iterable[Path], upstream: Path, root: Path = ROOT) -> list[Citation]:
    """Extract and check the citations of ``files``; paths in messages are root-relative."""
    checker = Checker(upstream)
    results: list[Citation] = []
    for path in files:
        try:
            shown = path.relative_to(root)
        except ValueError:
            shown = path
        text = path.read_text(encoding="utf-8", errors="replace")
        results.extend(checker.check(c) for c in extract(text, shown))
    return results


def main(argv: list[str] | None = None) -> int:
    """List every citation with its status; exit 1 if any is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="files to check (default: the course)")
    parser.add_argument("--upstream", type=Path, default=None, help="unpacked vllm-0.22.1 tree")
    parser.add_argument("--errors-only", action="store_true", help="list only wrong citations")
    args = parser.parse_args(argv)
    try:
        upstream = args.upstream or ensure_upstream()
    except UpstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = [p.resolve() for p in args.files] or course_files()
    results = check_files(files, upstream)
    bad = [c for c in results if not c.ok]
    for c in results:
        if c.ok and args.errors_only:
            continue
        if c.ok:
            symbol = f" {c.symbol}" if c.symbol else ""
            print(f"ok     {c.where}: {c.cited}{symbol} ({c.message})")
        else:
            print(f"WRONG  {c.message}")
    print(
        f"{len(results)} citation(s) in {len(files)} file(s): {len(results) - len(bad)} ok, "
        f"{len(bad)} wrong"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
