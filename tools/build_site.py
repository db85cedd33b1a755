"""Assemble the course site: ``python tools/build_site.py [--out DIR]``, then mkdocs builds it.

The course's Markdown lives where it is read in an editor or on a forge: ``README.md`` at the
root, ``phases/``, ``labs/*/README.md``, ``docs/``. mkdocs refuses the repository root as its
``docs_dir`` (its own output and ``.venv`` would be inside), so this tool copies the pages into a
docs tree and writes the config that builds it::

    build/site-src/               the docs tree (copies, never symlinks)
    build/mkdocs.generated.yml    INHERITs mkdocs.yml, adds docs_dir, nav, this hook, watch
    build/site/                   the HTML, written by ``mkdocs build``

``make site`` is ``python tools/build_site.py && mkdocs build --strict -f
build/mkdocs.generated.yml``; ``make docs`` serves the same config on 127.0.0.1:8000.

How it is split:

* ``mkdocs.yml`` (repository root) is the static half, edited by hand: theme, Markdown
  extensions, and ``validation`` set so that ``--strict`` fails on a broken link *or anchor*.
* The navigation is generated here, from the course order below and from what exists: phases
  are found as ``phases/NN-*/`` and each lists its pages in a fixed order (guide, deep dive,
  exercises, answers, quiz, interview, cheat sheet, then any other page); labs are found as
  ``labs/lab-NN-*/README.md``; the docs pages follow ``DOC_PAGES``. A page that is not written
  yet is simply absent, so the nav never points at a missing file and nobody edits a list when
  a phase or a lab lands.
* Links are rewritten so that every link left in the tree resolves inside the site: a link to a
  copied page or figure is re-pointed at the copy (``README.md`` at the root becomes
  ``index.md``); a link to anything else (a ``.py`` file, a folder, ``../shared``, a page that
  is not written yet) becomes plain text with the repository path in backticks, e.g.
  ``[the stub](block_pool.py)`` in a lab README becomes
  ``the stub (`labs/lab-01-block-allocator/block_pool.py`)``. Fenced code and inline code are
  never touched. Anchors are kept as written: mkdocs checks them against the headings.
* The generated config names this file as an mkdocs hook: ``on_pre_build`` assembles again, so
  ``mkdocs serve`` (which also watches the source folders) shows an edited page on reload.
  Files are rewritten only when their content changed, so the watcher settles. A second hook,
  ``on_page_markdown``, gives each page's browser title its own first heading, while the
  sidebar keeps the short nav label ("Guide", "Cheat sheet").

Standard library only: ``make docs`` and the tests run it with the course's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shutil
import sys
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "build"
SRC_DIRNAME = "site-src"
SITE_DIRNAME = "site"
CONFIG_NAME = "mkdocs.generated.yml"

# Pages of a phase folder, in reading order, with their title in the navigation. Any other
# Markdown page of the folder follows them, titled by its first heading.
PHASE_PAGES: list[tuple[str, str]] = [
    ("README.md", "Guide"),
    ("deep-dive.md", "Deep dive"),
    ("EXERCISES.md", "Exercises"),
    ("ANSWERS.md", "Answers"),
    ("QUIZ.md", "Self-check quiz"),
    ("INTERVIEW.md", "Interview questions"),
    ("CHEATSHEET.md", "Cheat sheet"),
]

# Section titles of the phases; a phase missing here is titled from its folder name.
PHASE_TITLES: dict[str, str] = {
    "00": "00 · The KV cache",
    "01": "01 · Engine tour",
    "02": "02 · Paged KV memory",
    "03": "03 · Prefix caching and scheduling",
    "04": "04 · Attention kernels",
    "05": "05 · End to end",
    "06": "06 · Online serving",
    "07": "07 · Tensor parallelism",
}

# The reference pages, in order (repository paths). Other pages under docs/ follow them.
DOC_PAGES: list[tuple[str, str]] = [
    ("docs/grader.md", "The grader"),
    ("docs/instructors.md", "Instructor guide"),
    ("docs/performance.md", "Performance"),
    ("docs/upstream-fidelity.md", "Upstream fidelity"),
    ("docs/citations.md", "Citing upstream"),
    ("UPSTREAM_PIN.md", "The vLLM pin"),
    ("CONTRIBUTING.md", "Contributing"),
    ("docs/dev/authoring-labs.md", "Authoring a lab"),
]

# Pages shown together right after Home: every figure of the course, and the notebooks behind them.
PICTURE_PAGES: list[tuple[str, str]] = [
    ("docs/pictures.md", "Pictures"),
    ("notebooks/README.md", "Notebooks"),
]

# Measurement pages written by bench/ (their headings repeat, so they get titles here). Any other
# page of docs/perf/ follows them, titled by its first heading of any level.
PERF_TITLES: dict[str, str] = {
    "docs/perf/paged_decode_h100.md": "Paged decode kernel (H100)",
    "docs/perf/decode_tiles_h100.md": "Decode tile sweep (H100)",
    "docs/perf/engine_cpu.md": "Engine benchmark (CPU)",
    "docs/perf/engine_h100.md": "Engine benchmark (H100)",
    "docs/perf/profile_step_h100_smollm2.md": "Step profile, SmolLM2 (H100)",
    "docs/perf/profile_step_h100_smollm2_fused.md": "Step profile, fused (H100)",
    "docs/perf/profile_step_h100_smollm2_unfused.md": "Step profile, unfused (H100)",
}

# The course order lives in one place: the table under this heading of the root README. Each
# row links one phase, then the labs of that phase in the order they are done; the navigation
# lists each lab inside its phase, in that order, and the tests check that the phase pages and
# the lab READMEs say the same.
COURSE_TABLE_HEADING = "## The course"

# Single files copied from the repository root (besides README.md, which becomes index.md).
ROOT_PAGES = ("CONTRIBUTING.md", "UPSTREAM_PIN.md")
# Files of notebooks/ that are copied: the page, and the notebooks it and the labs link to.
NOTEBOOK_SUFFIXES = frozenset({".md", ".ipynb"})
# Besides Markdown, the files of phases/ that are copied (figures).
ASSET_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"})
# What ``mkdocs serve`` watches besides the docs tree, so an edited source page rebuilds.
WATCHED = ("phases", "labs", "docs", "notebooks", "README.md", "CONTRIBUTING.md")

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FENCE_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# An inline link or image: [text](target "title"); the text may hold one level of brackets
# and may wrap across lines, the target may not.
_LINK_RE = re.compile(
    r"(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\(\s*(?P<target><[^>\n]*>|[^\s()]+)(?P<title>\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)"
)
# A reference definition: [label]: target
_REF_DEF_RE = re.compile(r"^(?P<lead> {0,3}\[[^\]]+\]:[ \t]*)(?P<target><[^>]*>|\S+)", re.M)
_H1_RE = re.compile(r"^#\s+(.+?)\s*#*\s*$")
_HEADING_RE = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_LAB_LINK_RE = re.compile(r"\]\((?:\./)?(labs/[^/)\s]+)/README\.md\)")
_PHASE_LINK_RE = re.compile(r"\]\((?:\./)?phases/([0-9][0-9]-[^/)\s]+)/(?:README\.md)?\)")


# ----------------------------------------------------------------------------------------------
# What goes into the site
# ----------------------------------------------------------------------------------------------


def _visible(path: Path, base: Path) -> bool:
    return not any(
        part.startswith(".") or part == "__pycache__" for part in path.relative_to(base).parts
    )


def site_files(root: Path = ROOT) -> dict[str, str]:
    """Repository path -> site path of every file the site is made of (POSIX, relative)."""
    files: dict[str, str] = {}
    if (root / "README.md").is_file():
        files["README.md"] = "index.md"
    for name in ROOT_PAGES:
        if (root / name).is_file():
            files[name] = name
    phases = root / "phases"
    if phases.is_dir():
        for path in sorted(phases.rglob("*")):
            if (
                path.is_file()
                and _visible(path, phases)
                and (path.suffix == ".md" or path.suffix.lower() in ASSET_SUFFIXES)
            ):
                rel = path.relative_to(root).as_posix()
                files[rel] = rel
    labs = root / "labs"
    if labs.is_dir():
        for path in sorted(labs.glob("*/README.md")):
            rel = path.relative_to(root).as_posix()
            files[rel] = rel
    notebooks = root / "notebooks"
    if notebooks.is_dir():
        for path in sorted(notebooks.iterdir()):
            if path.is_file() and path.suffix in NOTEBOOK_SUFFIXES and _visible(path, notebooks):
                rel = path.relative_to(root).as_posix()
                files[rel] = rel
    docs = root / "docs"
    if docs.is_dir():
        for path in sorted(docs.rglob("*")):
            if path.is_file() and _visible(path, docs):
                rel = path.relative_to(root).as_posix()
                files[rel] = rel
    return files


# ----------------------------------------------------------------------------------------------
# Link rewriting
# ----------------------------------------------------------------------------------------------


@dataclass
class Rewriter:
    """Rewrites the links of one page, given where every site file came from."""

    files: dict[str, str]
    root: Path = ROOT
    notes: list[str] = field(default_factory=list)

    def page(self, text: str, source: str) -> str:
        """``text`` of the repository page ``source`` with its links made site-safe."""
        out: list[str] = []
        prose: list[str] = []
        fence: str | None = None
        for line in text.splitlines(keepends=True):
            if fence is None:
                match = _FENCE_RE.match(line)
                if match:
                    out.append(self._prose("".join(prose), source))
                    prose = []
                    fence = match.group(1)
                    out.append(line)
                else:
                    prose.append(line)
            else:
                out.append(line)
                stripped = line.strip()
                if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                    fence = None
        out.append(self._prose("".join(prose), source))
        return "".join(out)

    def _prose(self, text: str, source: str) -> str:
        if "](" not in text and "]:" not in text:
            return text
        code = [m.span() for m in _CODE_SPAN_RE.finditer(text)]

        def in_code(pos: int) -> bool:
            return any(start <= pos < end for start, end in code)

        def link(match: re.Match[str]) -> str:
            if in_code(match.start()):
                return match.group(0)
            target = match.group("target").strip("<>")
            new = self._target(target, source)
            if new is not None:
                title = match.group("title") or ""
                return f"{match.group('bang')}[{match.group('text')}]({new}{title})"
            shown = self._shown_path(target, source)
            self.notes.append(f"{source}: link to {shown} (not in the site) kept as text")
            return _as_text(match.group("text"), shown)

        def ref(match: re.Match[str]) -> str:
            if in_code(match.start()):
                return match.group(0)
            target = match.group("target").strip("<>")
            new = self._target(target, source)
            if new is None:
                self.notes.append(
                    f"{source}: reference definition to {target} points outside the site; "
                    "use an inline link so that it can be shown as text"
                )
                return match.group(0)
            return match.group("lead") + new

        text = _LINK_RE.sub(link, text)
        return _REF_DEF_RE.sub(ref, text)

    def _resolve(self, target: str, source: str) -> tuple[str, str] | None:
        """(repository path, '#fragment') of a relative target, or None for an external one."""
        if not target or target.startswith("#") or target.startswith("//"):
            return None
        if _SCHEME_RE.match(target):
            return None
        url, hash_, fragment = target.partition("#")
        url = urllib.parse.unquote(url)
        if url.startswith("/"):
            path = posixpath.normpath(url.lstrip("/"))
        else:
            path = posixpath.normpath(posixpath.join(posixpath.dirname(source), url))
        return path, hash_ + fragment

    def _target(self, target: str, source: str) -> str | None:
        """The rewritten target, or None when it leads outside the site."""
        resolved = self._resolve(target, source)
        if resolved is None:
            return target  # external URL or same-page anchor: as written
        path, fragment = resolved
        if path not in self.files and (self.root / path).is_dir():
            readme = posixpath.join(path, "README.md")
            path = readme if readme in self.files else path
        if path not in self.files:
            return None
        here = posixpath.dirname(self.files[source])
        return posixpath.relpath(self.files[path], here or ".") + fragment

    def _shown_path(self, target: str, source: str) -> str:
        resolved = self._resolve(target, source)
        if resolved is None:
            return target
        path = resolved[0]
        if (self.root / path).is_dir() and not path.endswith("/"):
            path += "/"
        return path


def _as_text(text: str, path: str) -> str:
    """A link that cannot be followed in the site: its words, and the path to find it by."""
    words = " ".join(text.split())
    bare = words.strip("`").rstrip("/")
    if not words or bare in (path.rstrip("/"), posixpath.basename(path.rstrip("/"))):
        return f"`{path}`"
    return f"{text} (`{path}`)"


# ----------------------------------------------------------------------------------------------
# Navigation
# ----------------------------------------------------------------------------------------------


NavItem = dict[str, Any]


def heading_of(text: str) -> str | None:
    """The text of the first level-1 heading outside code, without backticks."""
    fence = False
    for line in text.splitlines():
        if _FENCE_RE.match(line):
            fence = not fence
        elif not fence and (match := _H1_RE.match(line)):
            return match.group(1).replace("`", "")
    return None


def first_heading(path: Path) -> str | None:
    """The first level-1 heading of the page at ``path``."""
    return heading_of(path.read_text(encoding="utf-8", errors="replace"))


def any_heading(path: Path) -> str | None:
    """The first heading of any level (pages written by tools often start at ``##``)."""
    fence = False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if _FENCE_RE.match(line):
            fence = not fence
        elif not fence and (match := _HEADING_RE.match(line)):
            return match.group(1).replace("`", "")
    return None


def course_order(root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """The rows of the root README's course table: (phase folder, [lab folder, ...]).

    A row is a table line under ``COURSE_TABLE_HEADING`` that links ``phases/NN-name/``; its
    lab links (``labs/<folder>/README.md``) are collected in the order they appear, which is
    the order the course recommends. A README without the table gives an empty order.
    """
    readme = root / "README.md"
    if not readme.is_file():
        return []
    rows: list[tuple[str, list[str]]] = []
    inside = False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = line.strip() == COURSE_TABLE_HEADING
            continue
        if not inside or not line.lstrip().startswith("|"):
            continue
        phase = _PHASE_LINK_RE.search(line)
        if phase:
            labs = [Path(m).name for m in _LAB_LINK_RE.findall(line)]
            rows.append((phase.group(1), list(dict.fromkeys(labs))))
    return rows


def _phase_title(folder: str) -> str:
    number, _, slug = folder.partition("-")
    return PHASE_TITLES.get(number) or f"{number} · {slug.replace('-', ' ').capitalize()}"


def _lab_title(folder: Path, root: Path) -> str:
    """``lab-01 · <title from the lab's lab.json>``, else the README's first heading."""
    match = re.match(r"lab-(\d+)", folder.name)
    label = f"lab-{match.group(1)}" if match else folder.name
    if match:
        meta = root / "tests" / "labs" / f"lab_{match.group(1)}" / "lab.json"
        try:
            title = json.loads(meta.read_text(encoding="utf-8"))["title"]
            # "The block allocator: free queue and block pool" -> "The block allocator"
            return f"{label} · {title.split(':')[0].strip()}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    heading = first_heading(folder / "README.md")
    if heading and " — " in heading:  # "quiz-01 — the engine tour" -> "quiz-01 · The engine tour"
        head, _, rest = heading.partition(" — ")
        return f"{head} · {rest[:1].upper()}{rest[1:]}"
    return heading or label


# Where a phase's labs go among its pages: after the guide and the deep dive, before exercises.
_LABS_AFTER = ("README.md", "deep-dive.md")


def build_nav(files: dict[str, str], root: Path = ROOT) -> list[NavItem]:
    """The navigation in course order, made only of pages that exist (site paths).

    Home, then the pictures, then each phase with its labs inside it (in the order of the root
    README's course table, so the sidebar reads in the order the course is done), then any lab
    that no row of the table names yet, then the reference pages.
    """
    nav: list[NavItem] = []
    if "README.md" in files:
        nav.append({"Home": files["README.md"]})

    pictures = [{title: files[rel]} for rel, title in PICTURE_PAGES if rel in files]
    if pictures:
        nav.append({"Pictures": pictures})

    labs_of = dict(course_order(root))
    placed: set[str] = set()

    def lab_entries(phase: str) -> list[NavItem]:
        entries = []
        for folder in labs_of.get(phase, []):
            rel = f"labs/{folder}/README.md"
            if rel in files and rel not in placed:
                entries.append({_lab_title(root / "labs" / folder, root): files[rel]})
                placed.add(rel)
        return entries

    phase_dirs = sorted(
        p for p in (root / "phases").glob("[0-9][0-9]-*") if p.is_dir() and _visible(p, root)
    )
    for phase in phase_dirs:
        entries: list[NavItem] = []
        named = set()
        labs_done = False
        for name, title in PHASE_PAGES:
            if not labs_done and name not in _LABS_AFTER:
                entries.extend(lab_entries(phase.name))
                labs_done = True
            rel = f"phases/{phase.name}/{name}"
            if rel in files:
                entries.append({title: files[rel]})
                named.add(rel)
        if not labs_done:
            entries.extend(lab_entries(phase.name))
        for path in sorted(phase.rglob("*.md")):
            rel = path.relative_to(root).as_posix()
            if rel in files and rel not in named:
                entries.append({first_heading(path) or path.stem: files[rel]})
        if entries:
            nav.append({_phase_title(phase.name): entries})

    labs = [
        {_lab_title(p.parent, root): files[p.relative_to(root).as_posix()]}
        for p in sorted((root / "labs").glob("*/README.md"))
        if p.relative_to(root).as_posix() in files and p.relative_to(root).as_posix() not in placed
    ]
    if labs:
        nav.append({"Labs": labs})

    reference: list[NavItem] = []
    named = {rel for rel, _ in PICTURE_PAGES}
    for rel, title in DOC_PAGES:
        if rel in files:
            reference.append({title: files[rel]})
            named.add(rel)
    measurements: list[NavItem] = []
    for rel, title in PERF_TITLES.items():
        if rel in files:
            measurements.append({title: files[rel]})
            named.add(rel)
    for rel in sorted(files):
        if rel.startswith("docs/") and rel.endswith(".md") and rel not in named:
            title = any_heading(root / rel) or Path(rel).stem
            target = measurements if rel.startswith("docs/perf/") else reference
            target.append({title: files[rel]})
    if measurements:
        reference.append({"Measurements": measurements})
    if reference:
        nav.append({"Reference": reference})
    return nav


def _yaml_nav(items: Iterable[NavItem], indent: int) -> list[str]:
    """YAML lines of a nav list; every scalar is a JSON string, which YAML reads as is."""
    lines: list[str] = []
    pad = " " * indent
    for item in items:
        ((title, value),) = item.items()
        if isinstance(value, list):
            lines.append(f"{pad}- {json.dumps(title, ensure_ascii=False)}:")
            lines.extend(_yaml_nav(value, indent + 4))
        else:
            lines.append(
                f"{pad}- {json.dumps(title, ensure_ascii=False)}: "
                f"{json.dumps(value, ensure_ascii=False)}"
            )
    return lines


def _rel(path: Path, start: Path) -> str:
    try:
        return Path(os.path.relpath(path, start)).as_posix()
    except ValueError:  # another drive (Windows): an absolute path still works
        return path.as_posix()


def render_config(nav: list[NavItem], out: Path, root: Path = ROOT) -> str:
    """The generated mkdocs config: mkdocs.yml plus what depends on the build folder."""
    lines = [
        "# Generated by tools/build_site.py: edit mkdocs.yml (theme, extensions) or the",
        "# course order in tools/build_site.py (navigation), never this file.",
        f"INHERIT: {json.dumps(_rel(root / 'mkdocs.yml', out))}",
        f"docs_dir: {json.dumps(SRC_DIRNAME)}",
        f"site_dir: {json.dumps(SITE_DIRNAME)}",
        "hooks:",
        f"  - {json.dumps(_rel(Path(__file__).resolve(), out))}",
        "watch:",
    ]
    lines += [
        f"  - {json.dumps(_rel(root / name, out))}" for name in WATCHED if (root / name).exists()
    ]
    lines.append("nav:")
    lines += _yaml_nav(nav, 2)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Assembly
# ----------------------------------------------------------------------------------------------


@dataclass
class Report:
    pages: int = 0
    written: int = 0
    removed: int = 0
    notes: list[str] = field(default_factory=list)
    config: Path | None = None


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def assemble(out: Path = DEFAULT_OUT, root: Path = ROOT) -> Report:
    """Write ``out/site-src`` and ``out/mkdocs.generated.yml``; return what was done."""
    out = out.resolve()
    src_dir = out / SRC_DIRNAME
    files = site_files(root)
    rewriter = Rewriter(files, root)
    report = Report(pages=sum(1 for s in files.values() if s.endswith(".md")))
    for rel, site_rel in files.items():
        source = root / rel
        if rel.endswith(".md"):
            text = source.read_text(encoding="utf-8")
            data = rewriter.page(text, rel).encode("utf-8")
        else:
            data = source.read_bytes()
        report.written += _write_if_changed(src_dir / site_rel, data)

    # Drop what a previous run copied and the sources no longer have.
    keep = {src_dir / s for s in files.values()}
    if src_dir.is_dir():
        for path in sorted(src_dir.rglob("*"), reverse=True):
            if path.is_file() and path not in keep:
                path.unlink()
                report.removed += 1
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()

    config = out / CONFIG_NAME
    _write_if_changed(config, render_config(build_nav(files, root), out, root).encode("utf-8"))
    report.notes = rewriter.notes
    report.config = config
    return report


def on_pre_build(config: Any, **_: Any) -> None:
    """mkdocs hook: assemble again into this build's docs_dir, so ``mkdocs serve`` is live."""
    assemble(Path(config["docs_dir"]).parent, ROOT)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """mkdocs hook: the browser tab shows the page's own heading, the sidebar its short label.

    A nav title ("Guide") names the page everywhere in mkdocs; Material's ``<title>`` prefers
    ``page.meta.title``, so that is set to the first heading when the page has not set one.
    """
    heading = heading_of(markdown)
    if heading and "title" not in page.meta and not page.is_homepage:
        page.meta["title"] = heading
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder for site-src/ and the generated config (default: build/)",
    )
    parser.add_argument("--clean", action="store_true", help="delete OUT/site-src first")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="list the links turned into text"
    )
    args = parser.parse_args(argv)
    if args.clean:
        shutil.rmtree(args.out / SRC_DIRNAME, ignore_errors=True)
    report = assemble(args.out)
    if args.verbose:
        for note in report.notes:
            print(f"  {note}")
    print(
        f"{report.pages} pages assembled into {args.out / SRC_DIRNAME} ({report.written} "
        f"written, {report.removed} removed, {len(report.notes)} links kept as text); "
        f"build with: mkdocs build --strict -f {report.config}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
