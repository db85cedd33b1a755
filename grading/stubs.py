"""Stubs are generated from the solutions, so the two can never drift.

A lab's ``tasks`` (in its ``lab.json``) name the functions a learner writes, each with a
one-line task. The stub is the solution file with each task's body replaced by
``raise NotImplementedError("lab-NN: Name — task")``, keeping its signature and docstring.
``tests/test_lab_sync.py`` checks that the committed stubs equal what this generates, and
that the solutions equal the reference. Neither resetting a lab nor regenerating the stubs
loses work: a file that differs from the stub it would get is replaced only with ``--force``,
after a timestamped backup (``stubs`` also replaces, without ``--force``, a stale stub that is
still the version committed to git: nobody edited it since).
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import time
from pathlib import Path

from grading.labs import Lab


class StubError(Exception):
    """A task names a function the solution does not define."""


def _find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        for node in scope:
            is_last = i == len(parts) - 1
            if (
                is_last
                and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == part
            ):
                return node  # type: ignore[return-value]
            if not is_last and isinstance(node, ast.ClassDef) and node.name == part:
                scope = node.body
                break
        else:
            break
    raise StubError(f"the solution defines no function {qualname!r}")


def _wrap(text: str, width: int) -> list[str]:
    """Split a message into pieces for implicit string concatenation, at spaces."""
    words, parts, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            parts.append(line + " ")
            line = word
        else:
            line = f"{line} {word}" if line else word
    parts.append(line)
    return parts


def make_stub(lab: Lab, filename: str, solution_source: str) -> str:
    """The stub text for one file of a lab."""
    tasks = lab.tasks.get(filename, {})
    tree = ast.parse(solution_source)
    lines = solution_source.splitlines()
    edits = []
    for qualname, task in tasks.items():
        fn = _find_function(tree, qualname)
        body = fn.body
        has_doc = (
            isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        if has_doc and len(body) == 1:
            raise StubError(f"{qualname} has only a docstring: nothing to stub")
        first = body[1] if has_doc else body[0]
        # The body is replaced from just after the docstring (comments before the first
        # statement go too), or from the first statement when there is no docstring.
        start = (body[0].end_lineno or body[0].lineno) if has_doc else first.lineno - 1
        indent = " " * first.col_offset
        message = f"{lab.id}: {qualname} — {task}"
        raise_lines = [
            f"{indent}raise NotImplementedError(",
            *[f'{indent}    "{part}"' for part in _wrap(message, 90 - len(indent))],
            f"{indent})",
        ]
        edits.append((start, fn.end_lineno or fn.lineno, raise_lines))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start:end] = replacement
    header = (
        f"# {lab.id}: write the functions below that raise NotImplementedError.\n"
        f"# Grade your work: make {lab.id}   Guide: labs/{lab.stub_dir.name}/README.md\n"
    )
    return header + "\n".join(lines) + "\n"


def expected_stubs(lab: Lab) -> dict[Path, str]:
    """The generated stub of each of the lab's files (none for a hand-written answer sheet)."""
    out: dict[Path, str] = {}
    if lab.stub == "hand":
        return out
    for filename in lab.files:
        solution = (lab.solution_dir / filename).read_text()
        out[lab.stub_dir / filename] = make_stub(lab, filename, solution)
    return out


def _backup(path: Path) -> Path:
    backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
    backup.write_bytes(path.read_bytes())
    return backup


def reset_lab(lab: Lab, force: bool = False) -> int:
    """Put the lab's stub files back; edited files only with ``force``, after a backup."""
    refused = []
    for path, text in expected_stubs(lab).items():
        rel = path.relative_to(lab.stub_dir.parent.parent)
        if path.exists() and path.read_text() == text:
            print(f"{rel}: already the original stub")
            continue
        if path.exists() and not force:
            changed = sum(
                1
                for d in difflib.ndiff(text.splitlines(), path.read_text().splitlines())
                if d[:1] in "+-"
            )
            refused.append(rel)
            print(f"{rel}: you edited this file ({changed} lines differ); not touched")
            continue
        if path.exists():
            print(f"{rel}: saved your version as {_backup(path).name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"{rel}: reset to the original stub")
    if refused:
        print(
            f"Nothing of yours was overwritten. To replace them anyway (each is backed up "
            f"first): make reset-{lab.id} FORCE=1"
        )
        return 1
    return 0


def _committed_text(path: Path) -> str | None:
    """``path`` as the git checkout's ``HEAD`` holds it, or None (no git, untracked, an error)."""
    try:  # ``HEAD:./name`` is relative to the folder git runs in
        return subprocess.run(
            ["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def check_or_write_stubs(labs: list[Lab], check: bool, force: bool = False) -> int:
    """``--check``: report stale stubs (exit 1). Otherwise regenerate them: a file that differs
    from its stub is replaced only if it is still the committed one (a stale stub nobody
    edited) or with ``force``, after a backup; an edited one is never touched (exit 1)."""
    stale = refused = 0
    for lab in labs:
        for path, text in expected_stubs(lab).items():
            if path.exists() and path.read_text() == text:
                continue
            stale += 1
            if check:
                print(f"stale stub: {path} (run `python -m grading stubs`)")
                continue
            if path.exists() and not force and path.read_text() != _committed_text(path):
                refused += 1
                print(f"{path}: edited since the last commit; not touched (--force replaces it)")
                continue
            if path.exists():
                print(f"{path}: previous version saved as {_backup(path).name}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"{path}: written")
    return 1 if (check and stale) or refused else 0
