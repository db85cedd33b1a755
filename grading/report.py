"""How a grade is shown: a rich table on the terminal, ``results.json`` for Gradescope."""

from __future__ import annotations

import json
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


def print_table(lab: Lab, results: list[TestResult], verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

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
        table.add_row(r.info.name, f"[{style}]{label}[/]", f"{r.score}/{r.info.points}", text)
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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
