"""Hunt for holes in a graded suite: grade every small operator mutation of a lab's solution.

The mutants kept in ``tests/buggy/`` are mistakes someone thought of. This sweep thinks of none:
it applies each of a few mechanical edits (a comparison flipped or made strict, ``and`` for
``or``, an integer one off, ``+`` for ``-``, ``x`` for ``list(x)`` or ``x.copy()``, a statement,
``raise`` or ``return`` deleted, an ``if`` always or never taken, two arguments swapped, a
slice's or ``range``'s bound one off, ``=`` for ``+=``) at every place it fits inside the
functions the lab grades (its ``tasks``), grades each edit the way ``check-suites`` grades a
mutant (stopping at the first failing test), and lists the ones that score full marks.
A survivor is either equivalent (no behaviour the lab's contract can observe changed: a
deleted ``assert``, a sentinel's id) or a hole: then strengthen a test and keep the mistake,
written as a learner would write it, as a mutant (docs/dev/authoring-labs.md, "Sweeping a
suite"). Edits are made on tokens, so strings and comments are never touched.

    python tools/mutation_sweep.py lab-01 --list      # the edits, not graded
    python tools/mutation_sweep.py lab-01             # grade them; survivors at the end
"""

from __future__ import annotations

import argparse
import ast
import io
import itertools
import shutil
import sys
import tempfile
import time
import tokenize
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grading.check_suites import grade_edited_solution  # noqa: E402
from grading.labs import Lab, load_lab  # noqa: E402
from grading.protocol import TestInfo  # noqa: E402
from grading.report import totals  # noqa: E402
from grading.runner import SuiteRunner  # noqa: E402

#: Token -> its replacements. Each is a mistake of the kind a learner makes by one keystroke.
SWAPS: dict[str, tuple[str, ...]] = {
    "<": ("<=",),
    "<=": ("<",),
    ">": (">=",),
    ">=": (">",),
    "==": ("!=",),
    "!=": ("==",),
    "+": ("-",),
    "-": ("+",),
    "+=": ("-=", "="),
    "-=": ("+=", "="),
    "//": ("/",),
    "and": ("or",),
    "or": ("and",),
    "True": ("False",),
    "False": ("True",),
    "break": ("continue",),
    "continue": ("break",),
    "min": ("max",),
    "max": ("min",),
    "is": ("is not",),
}
#: Binary ``+``/``-`` only: after one of these tokens the operator is not a sign.
OPERAND_END = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING}


@dataclass(frozen=True)
class Edit:
    """One mechanical change of one solution file."""

    file: str
    function: str
    line: int
    kind: str
    before: str  # the line as the solution has it
    text: str  # the whole edited file

    def describe(self) -> str:
        after = self.text.splitlines()[self.line - 1].strip()
        return f"{self.file}:{self.line} {self.function} [{self.kind}] {self.before}  ->  {after}"


def graded_spans(source: str, qualnames: set[str]) -> list[tuple[str, int, int, list[ast.stmt]]]:
    """(qualname, first body line, last line, body) of each graded function, docstring left out."""
    spans = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef) and f"{prefix}{node.name}" in qualnames:
                stmts = node.body
                if (
                    stmts
                    and isinstance(stmts[0], ast.Expr)
                    and isinstance(stmts[0].value, ast.Constant)
                ):
                    stmts = stmts[1:]
                if stmts:
                    spans.append(
                        (f"{prefix}{node.name}", stmts[0].lineno, node.end_lineno or 0, stmts)
                    )

    walk(ast.parse(source).body, "")
    return spans


#: What each edit generator yields: (first line, last line, kind, the replacement of those lines).
Change = tuple[int, int, str, str]


def _token_edits(lines: list[str], first: int, last: int) -> Iterator[Change]:
    """Every token swap between lines ``first`` and ``last``, one line each."""
    source = "".join(lines)
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        row, col = token.start
        if first <= row <= last and token.start[0] == token.end[0]:
            options: tuple[str, ...] = SWAPS.get(token.string, ())
            if token.string in ("+", "-") and (
                previous is None
                or (previous.type not in OPERAND_END and previous.string not in ")]}")
            ):
                options = ()  # a sign, not a binary operator
            if token.type == tokenize.NUMBER and token.string.isdigit():
                value = int(token.string)
                options = tuple(str(v) for v in (value - 1, value + 1) if v >= 0)
            if token.string == "not":
                options = ("",)  # "not x" -> "x", "is not" -> "is"
            line = lines[row - 1]
            for new in options:
                end = token.end[1]
                if new == "" and line[end : end + 1] == " ":
                    end += 1  # "not x" -> "x"
                kind = f"{token.string} -> {new or '(removed)'}"
                yield row, row, kind, line[:col] + new + line[end:]
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token


#: Statements whose loss is a one-line mistake: a forgotten update, check, raise or return.
DELETABLE = (
    ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Expr | ast.Assert | ast.Raise | ast.Return
)


def _deletions(lines: list[str], body: list[ast.stmt]) -> Iterator[Change]:
    """Each simple statement of ``body``, nested ones too, replaced by ``pass``."""
    for stmt in body:
        if isinstance(stmt, DELETABLE):
            indent = lines[stmt.lineno - 1][: stmt.col_offset]
            end = stmt.end_lineno or stmt.lineno
            kind = {ast.Raise: "raise", ast.Return: "return"}.get(type(stmt), "statement")
            yield stmt.lineno, end, f"{kind} deleted", f"{indent}pass\n"
        for field in ("body", "orelse", "finalbody"):
            yield from _deletions(lines, getattr(stmt, field, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _deletions(lines, handler.body)


#: Calls whose removal is a classic mistake: an alias for a copy, the given order for another.
UNWRAP = {"list", "tuple", "sorted", "reversed"}


def _unwraps(lines: list[str], body: list[ast.stmt]) -> Iterator[Change]:
    """``list(x)``, ``sorted(x)``, ``x.copy()``, ... replaced by ``x``, one line each."""
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    in_messages = {
        id(n) for f in nodes if isinstance(f, ast.JoinedStr) for n in ast.walk(f)
    }  # an f-string's calls only change a message
    for node in nodes:
        if id(node) in in_messages:
            continue
        if not isinstance(node, ast.Call) or node.lineno != node.end_lineno or node.keywords:
            continue
        if isinstance(node.func, ast.Name) and node.func.id in UNWRAP and len(node.args) == 1:
            inner, name = node.args[0], node.func.id
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "copy" and not node.args:
            inner, name = node.func.value, "copy"
        else:
            continue
        line = lines[node.lineno - 1]
        source = line[inner.col_offset : inner.end_col_offset]
        new = line[: node.col_offset] + source + line[node.end_col_offset :]
        yield node.lineno, node.lineno, f"{name}() removed", new


def _replace(lines: list[str], node: ast.expr, new: str) -> Change:
    """``node``'s source (on one line) replaced by ``new``."""
    line = lines[node.lineno - 1]
    return node.lineno, node.lineno, line[: node.col_offset] + new + line[node.end_col_offset :]


def _one_line(node: ast.AST) -> bool:
    return isinstance(node, ast.expr) and node.lineno == node.end_lineno


#: Calls whose first two arguments commute, or that raise at once when they are swapped.
SYMMETRIC = {"min", "max", "isinstance", "tl.minimum", "tl.maximum"}


def _structural(lines: list[str], body: list[ast.stmt]) -> Iterator[Change]:
    """Edits of a whole expression: a guard always or never taken, the first two arguments of a
    call swapped, a bound that is not a literal (a slice's, ``range``'s) one off."""
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    in_messages = {id(n) for f in nodes if isinstance(f, ast.JoinedStr) for n in ast.walk(f)}
    for node in nodes:
        if id(node) in in_messages:
            continue
        if isinstance(node, ast.If) and _one_line(node.test):
            for value in ("True", "False"):
                row, _, new = _replace(lines, node.test, value)
                yield row, row, f"condition -> {value}", new
        if (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and _one_line(node)
            and ast.unparse(node.func) not in SYMMETRIC
        ):
            first, second = node.args[:2]
            if not any(isinstance(a, ast.Starred) for a in (first, second)):
                line = lines[node.lineno - 1]
                a = line[first.col_offset : first.end_col_offset]
                b = line[second.col_offset : second.end_col_offset]
                if a != b:
                    new = (
                        line[: first.col_offset]
                        + b
                        + line[first.end_col_offset : second.col_offset]
                        + a
                        + line[second.end_col_offset :]
                    )
                    yield node.lineno, node.lineno, "arguments swapped", new
        bounds: list[ast.expr | None] = []
        if isinstance(node, ast.Slice):
            bounds = [node.lower, node.upper]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "range"
        ):
            bounds = list(node.args[:2])
        for bound in bounds:
            if bound is None or isinstance(bound, ast.Constant) or not _one_line(bound):
                continue  # a literal's off-by-one is a token edit already
            text = lines[bound.lineno - 1][bound.col_offset : bound.end_col_offset]
            if not isinstance(bound, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
                text = f"({text})"
            for delta in ("+ 1", "- 1"):
                row, _, new = _replace(lines, bound, f"{text} {delta}")
                yield row, row, f"bound {delta}", new


def edits(lab: Lab) -> list[Edit]:
    """Every edit of the lab's solution that still parses and changes the text."""
    found: list[Edit] = []
    for filename, tasks in lab.tasks.items():
        source = (lab.solution_dir / filename).read_text()
        lines = source.splitlines(keepends=True)
        for qualname, first, last, body in graded_spans(source, set(tasks)):
            changes = itertools.chain(
                _token_edits(lines, first, last),
                _unwraps(lines, body),
                _structural(lines, body),
                _deletions(lines, body),
            )
            for start, end, kind, new in changes:
                text = "".join([*lines[: start - 1], new, *lines[end:]])
                if text == source:
                    continue
                try:
                    ast.parse(text)
                except SyntaxError:
                    continue
                found.append(Edit(filename, qualname, start, kind, lines[start - 1].strip(), text))
    return found


def grade(lab: Lab, edit: Edit, tests: list[TestInfo], workdir: Path) -> tuple[int, int]:
    """The edit's score on ``tests``, graded as ``check-suites`` grades a mutant."""
    folder = Path(tempfile.mkdtemp(dir=workdir)) / lab.dirname
    folder.mkdir()
    for filename in lab.files:
        shutil.copy(lab.solution_dir / filename, folder / filename)
    (folder / edit.file).write_text(edit.text)
    return totals(grade_edited_solution(lab, folder, tests))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", help="lab-NN")
    parser.add_argument("--list", action="store_true", help="print the edits, grade nothing")
    parser.add_argument("--workers", type=int, default=1, help="edits graded at once")
    parser.add_argument("--only", help="only the graded function with this qualname")
    parser.add_argument(
        "--kind", action="append", help="only edits whose kind contains this text (repeatable)"
    )
    args = parser.parse_args(argv)
    lab = load_lab(args.lab)
    todo = [
        e
        for e in edits(lab)
        if args.only in (None, e.function)
        and (args.kind is None or any(kind in e.kind for kind in args.kind))
    ]
    if args.list:
        for e in todo:
            print(e.describe())
        print(f"{len(todo)} edits")
        return 0
    tests = SuiteRunner(lab, lab.solution_dir).collect()
    survivors = []
    with tempfile.TemporaryDirectory(prefix="mutation-sweep-") as tmp:

        def one(e: Edit) -> tuple[Edit, int, int, float]:
            start = time.monotonic()
            return (e, *grade(lab, e, tests, Path(tmp)), time.monotonic() - start)

        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            for e, score, total, seconds in pool.map(one, todo):
                verdict = "caught" if score < total else "SURVIVED"
                print(f"{verdict:8} {seconds:5.1f}s {e.describe()}", flush=True)
                if score == total:
                    survivors.append(e)
    print(f"\n{len(todo)} edits, {len(todo) - len(survivors)} caught, {len(survivors)} survived:")
    for e in survivors:
        print(f"  {e.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
