"""How a grade is shown: a rich table on the terminal, ``results.json`` for Gradescope."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

from grading.labs import Lab
from grading.protocol import TestInfo, TestResult, printable

LABELS = {
    "passed": ("PASS", "green"),
    "failed": ("FAIL", "red"),
    "not_started": ("NOT STARTED", "yellow"),
    "error": ("ERROR", "red"),
    "timeout": ("TIMEOUT", "magenta"),
    "crashed": ("CRASHED", "magenta"),
    "skipped": ("SKIPPED", "red"),
}


def totals(results: list[TestResult]) -> tuple[int, int]:
    return sum(r.score for r in results), sum(r.info.points for r in results)


def _what_happened(result: TestResult) -> str:
    """The test's message; for a task not started, its first line only (which task)."""
    if result.outcome == "not_started":
        return result.message.splitlines()[0] if result.message else "not implemented yet"
    return result.message


def _where_to_look(info: TestInfo) -> str:
    return f"hint: {info.hint}\nread: {info.doc}"


def explanation(result: TestResult) -> str:
    """What the learner reads for one test: what happened, what broke, where to read."""
    if result.outcome == "passed":
        return ""
    return f"{_what_happened(result)}\n{_where_to_look(result.info)}"


def _cell(text: str) -> object:
    """Learner text as a literal cell: never parsed as rich markup."""
    from rich.text import Text

    return Text(text)


def nothing_started(results: list[TestResult]) -> bool:
    return bool(results) and all(r.outcome == "not_started" for r in results)


def rerun_command(lab_id: str, flag: str) -> str:
    """The command that grades ``lab_id`` again with ``flag``, in a form the learner can type.

    Under ``make lab-NN`` (make exports ``MAKELEVEL`` to its recipes) that is the make target;
    otherwise the interpreter running now, relative to the working folder when it lives there
    (the course's ``.venv``): a bare ``python`` is often one without the grader's dependencies.
    """
    if os.environ.get("MAKELEVEL"):
        return f"make {lab_id} LAB_FLAGS={flag}"
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(Path.cwd())
    return f"{exe} -m grading {lab_id} {flag}"


def print_not_started(lab: Lab, results: list[TestResult]) -> None:
    """The first screen of a learner: what to write first, where, and what to read."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=110)
    _, total = totals(results)
    first_task = next((name for tasks in lab.tasks.values() for name in tasks), "")
    first = next((r for r in results if first_task and first_task in r.message), results[0])
    out = Text()
    out.append(f"{lab.id}: {lab.title}\n", style="bold")
    out.append(f"Nothing is implemented yet: all {len(results)} tests are NOT STARTED.\n\n")
    for filename, tasks in lab.tasks.items():
        out.append(f"Edit  labs/{lab.dirname}/{filename}", style="bold")
        out.append(", in this order:\n")
        for i, (name, task) in enumerate(tasks.items()):
            out.append(f"  {i + 1:2d}. {name}", style="bold" if i == 0 else "")
            out.append(f" — {task}\n")
    if not lab.tasks:
        out.append(f"Edit the files in labs/{lab.dirname}/\n")
    out.append(f"\nRead first: {first.info.doc}\n")
    out.append(f"Guide:      labs/{lab.dirname}/README.md\n")
    out.append(
        "Each function you write turns rows into PASS or FAIL; "
        f"`{rerun_command(lab.id, '--verbose')}` shows every test now.\n"
    )
    console.print(out)
    console.print(f"[bold]score: 0 / {total}[/]")


#: Outcomes that are a failure of the learner's code (a cascade is made of these).
FAILING = ("failed", "error", "timeout", "crashed")
#: Below this many columns (or when stdout is not a terminal) the table becomes a plain list.
MIN_TABLE_WIDTH = 100
#: Lines of a message shown without --verbose: its beginning and its end (the middle is cut).
HEAD_LINES, TAIL_LINES = 6, 2


def _pattern(message: str) -> str:
    """A message's first line with its numbers blanked: rows failing "the same way"."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return re.sub(r"-?\d+(\.\d+)?", "N", first)[:100]


def cascade_line(results: list[TestResult]) -> str | None:
    """When several rows fail the same way, which test to fix first.

    Tests run and print in the order the guide teaches (``lab.json``'s ``order``), so the
    earliest failing test is the most basic piece that is broken; a bug there (a ``popleft``
    that leaves links behind) makes later tests fail with one same error far from the cause.
    """
    failing = [r for r in results if r.outcome in FAILING]
    if len(failing) < 2:
        return None
    groups: dict[str, list[TestResult]] = {}
    for r in failing:
        groups.setdefault(_pattern(r.message), []).append(r)
    pattern, group = max(groups.items(), key=lambda kv: len(kv[1]))
    if len(group) < 3 or not pattern:
        return None
    first = failing[0]
    shown = group[0].message.strip().splitlines()[0]
    shown = shown if len(shown) <= 90 else shown[:87] + "..."
    if len(group) == len(failing) and len({r.message for r in group}) == 1:
        # one message for every row (an import error, reported once per test): no test is
        # the cause, the message is
        return f"fix first: {shown} (all {len(group)} failing rows report it)"
    return (
        f"fix first: {first.info.name} (the earliest failing test in the order the guide "
        f"teaches). {len(group)} rows fail the same way ({shown}): one bug usually "
        "causes them all."
    )


def _clip_middle(message: str) -> str:
    """The message's first and last lines; the middle is cut, so the end is never lost."""
    lines = message.splitlines()
    if len(lines) <= HEAD_LINES + TAIL_LINES + 1:
        return message
    cut = len(lines) - HEAD_LINES - TAIL_LINES
    return "\n".join(
        [*lines[:HEAD_LINES], f"… ({cut} lines cut: -v shows them)", *lines[-TAIL_LINES:]]
    )


def shown_text(result: TestResult, verbose: bool) -> str:
    """What a row shows: the message (cut in the middle unless verbose), hint and link."""
    if result.outcome == "passed":
        return ""
    if verbose or result.outcome == "not_started":
        return explanation(result)
    return f"{_clip_middle(result.message)}\n{_where_to_look(result.info)}"


def _wrap(text: str, width: int, indent: str) -> list[str]:
    """Lines of at most ``width`` columns, broken only at spaces: a path or a link
    (``read: phases/02-paged-attention/README.md#the-free-block-queue``) stays whole."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("read: ") or not line.strip():
            out.append(indent + line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        out.extend(
            textwrap.wrap(
                line,
                width=max(20, width - len(indent)),
                initial_indent=indent,
                subsequent_indent=indent + lead + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            or [indent]
        )
    return out


def summary_line(results: list[TestResult]) -> str:
    counts = {k: sum(r.outcome == k for r in results) for k in LABELS}
    return ", ".join(f"{n} {LABELS[k][0].lower()}" for k, n in counts.items() if n)


def print_plain(
    lab: Lab, results: list[TestResult], verbose: bool = False, width: int = 80
) -> None:
    """The plain layout: one line per test, its explanation indented below it.

    For narrow terminals and for output that is not a terminal (a log, a pipe, CI): nothing
    is drawn, lines break only at spaces, and a "read:" path is never broken.
    """
    score, total = totals(results)
    lines = [f"{lab.id}: {lab.title}", ""]
    for r in results:
        label = LABELS.get(r.outcome, (r.outcome.upper(), "red"))[0]
        lines.append(f"{label:<12}{r.score:>3}/{r.info.points:<3} {printable(r.info.name)}")
        text = shown_text(r, verbose)
        if text:
            lines.extend(_wrap(printable(text), width, "    "))
    lines.append("")
    cascade = cascade_line(results)
    if cascade:
        lines.extend(_wrap(printable(cascade), width, ""))
    lines.append(summary_line(results))
    lines.append(f"score: {score} / {total}")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _layout_width(results: list[TestResult]) -> int | None:
    """The terminal's width when the table fits it whole; None for the plain layout.

    The table needs room for its name column, the result and points, its borders, and the
    longest "read:" link unbroken (rich would fold it mid-word otherwise).
    """
    if not sys.stdout.isatty() or os.environ.get("MINI_VLLM_PLAIN"):
        return None
    width = shutil.get_terminal_size((80, 24)).columns
    names = max((len(r.info.name) for r in results), default=10)
    links = max((len(f"read: {r.info.doc}") for r in results if r.outcome != "passed"), default=40)
    needed = min(names, 38) + len("NOT STARTED") + len("points") + 13 + min(links, 90)
    return width if width >= max(MIN_TABLE_WIDTH, needed) else None


def print_table(lab: Lab, results: list[TestResult], verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    if not verbose and nothing_started(results):
        print_not_started(lab, results)
        return
    width = _layout_width(results)
    if width is None:
        print_plain(
            lab,
            results,
            verbose,
            width=shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 100,
        )
        return
    console = Console(highlight=False, width=width)
    score, total = totals(results)
    table = Table(title=f"{lab.id}: {lab.title}", show_lines=True, expand=False)
    table.add_column("test", overflow="fold", max_width=38)
    table.add_column("result", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("what to look at", overflow="fold", max_width=90)
    for r in results:
        label, style = LABELS.get(r.outcome, (r.outcome.upper(), "red"))
        table.add_row(
            _cell(r.info.name),
            f"[{style}]{label}[/]",
            f"{r.score}/{r.info.points}",
            _cell(shown_text(r, verbose)),
        )
    console.print(table)
    cascade = cascade_line(results)
    if cascade:
        console.print(_cell(cascade), style="bold")
    console.print(summary_line(results))
    console.print(f"[bold]score: {score} / {total}[/]")


def _json_output(result: TestResult, label: str) -> str:
    """A test's ``output`` in ``results.json``: the grader's own lines (the verdict, first and
    last, the hint and the link) start at the margin; the message, which quotes learner text,
    is indented, so no learner text can pass for a verdict line of the grader's."""
    if result.outcome == "passed":
        return label
    quoted = ["    " + line if line.strip() else "" for line in _what_happened(result).splitlines()]
    verdict = f"{label}: {result.score} / {result.info.points}"
    return "\n".join([label, *quoted, _where_to_look(result.info), verdict])


def write_results_json(
    lab: Lab, results: list[TestResult], path: Path, elapsed: float | None = None
) -> None:
    """Gradescope's results format: https://gradescope-autograders.readthedocs.io/."""
    score, _ = totals(results)
    tests = []
    for r in results:
        label = LABELS.get(r.outcome, (r.outcome,))[0]
        tests.append(
            {
                "name": f"{r.info.name}",
                "name_format": "text",
                "number": str(len(tests) + 1),
                "score": r.score,
                "max_score": r.info.points,
                "status": "passed" if r.outcome == "passed" else "failed",
                "output": _json_output(r, label),
                "output_format": "text",
                "visibility": r.info.visibility,
            }
        )
    visible = [r for r in results if r.info.visibility == "visible"]
    v_score, v_total = totals(visible)
    summary = f"{lab.id}: {v_score} / {v_total}"
    if len(visible) < len(results):
        summary += f" on the visible tests ({len(results) - len(visible)} more are hidden)"
    data = {
        "score": score,
        "output": summary,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }
    if elapsed is not None:
        data["execution_time"] = round(elapsed, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
