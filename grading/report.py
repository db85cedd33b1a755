"""How a grade is shown: a rich table on the terminal, ``results.json`` for Gradescope."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from grading.labs import Lab
from grading.protocol import TestResult

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


def explanation(result: TestResult) -> str:
    """What the learner reads for one test: what happened, what broke, where to read."""
    info = result.info
    if result.outcome == "passed":
        return ""
    if result.outcome == "not_started":
        task = result.message.splitlines()[0] if result.message else "not implemented yet"
        return f"{task}\nhint: {info.hint}\nread: {info.doc}"
    return f"{result.message}\nhint: {info.hint}\nread: {info.doc}"


def _cell(text: str) -> object:
    """Learner text as a literal cell: never parsed as rich markup."""
    from rich.text import Text

    return Text(text)


def nothing_started(results: list[TestResult]) -> bool:
    return bool(results) and all(r.outcome == "not_started" for r in results)


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
    out.append(f"Each function you write turns rows into PASS or FAIL; `python -m grading "
               f"{lab.id} --verbose` shows every test now.\n")
    console.print(out)
    console.print(f"[bold]score: 0 / {total}[/]")


def print_table(lab: Lab, results: list[TestResult], verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    if not verbose and nothing_started(results):
        print_not_started(lab, results)
        return
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    score, total = totals(results)
    table = Table(title=f"{lab.id}: {lab.title}", show_lines=True, expand=False)
    table.add_column("test", overflow="fold", max_width=38)
    table.add_column("result", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("what to look at", overflow="fold", max_width=90)
    for r in results:
        label, style = LABELS.get(r.outcome, (r.outcome.upper(), "red"))
        text = explanation(r)
        if not verbose and r.outcome not in ("passed",):
            lines = text.splitlines()
            text = "\n".join(lines[:8] + (["…"] if len(lines) > 8 else []))
        table.add_row(_cell(r.info.name), f"[{style}]{label}[/]", f"{r.score}/{r.info.points}",
                      _cell(text))
    console.print(table)
    counts = {k: sum(r.outcome == k for r in results) for k in LABELS}
    summary = ", ".join(f"{n} {LABELS[k][0].lower()}" for k, n in counts.items() if n)
    console.print(f"{summary}")
    console.print(f"[bold]score: {score} / {total}[/]")


def write_results_json(lab: Lab, results: list[TestResult], path: Path,
                       elapsed: float | None = None) -> None:
    """Gradescope's results format: https://gradescope-autograders.readthedocs.io/."""
    score, _ = totals(results)
    tests = []
    for r in results:
        label = LABELS.get(r.outcome, (r.outcome,))[0]
        tests.append({
            "name": f"{r.info.name}",
            "name_format": "text",
            "number": str(len(tests) + 1),
            "score": r.score,
            "max_score": r.info.points,
            "status": "passed" if r.outcome == "passed" else "failed",
            "output": f"{label}\n{explanation(r)}".strip(),
            "output_format": "text",
            "visibility": r.info.visibility,
        })
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
