"""``python -m grading LAB [--impl DIR] [--json FILE] [--chain]`` and the course's lab tools.

Also: ``python -m grading list``, ``python -m grading reset LAB [--force]``,
``python -m grading stubs [--check] [--force]`` (stubs from solutions) and
``python -m grading sync [--write]`` (solutions from the reference). The exit status is 0 whatever
the score; it is non-zero only when the grader itself cannot run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from grading.labs import PLANNED_LABS, LabNotFound, available_labs, load_lab


def _grade(argv: list[str]) -> int:
    from grading.child import harden_process
    from grading.report import print_table, write_results_json
    from grading.runner import GraderError, grade

    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__)
    parser.add_argument("lab", help="lab-01 … lab-11")
    parser.add_argument(
        "--impl", type=Path, help="folder holding the lab's files (default: labs/<lab>/)"
    )
    parser.add_argument("--json", type=Path, help="write Gradescope results.json here")
    parser.add_argument(
        "--chain", action="store_true", help="use your own earlier labs instead of the reference"
    )
    parser.add_argument("--quiet", action="store_true", help="print only the score line")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="full messages, and the whole table even when nothing is started",
    )
    args = parser.parse_args(argv)
    harden_process()
    started = time.monotonic()
    if args.json:
        # A results.json left by anyone before this run (a submission included) never counts.
        args.json.unlink(missing_ok=True)
    notes: list[str] = []
    try:
        lab, results = grade(args.lab, args.impl, chain=args.chain, notes=notes)
    except (LabNotFound, GraderError) as exc:
        print(f"grading: {exc}", file=sys.stderr)
        return 2
    from grading.report import totals

    if args.json:  # before printing: a broken terminal must not cost the results
        write_results_json(lab, results, args.json, time.monotonic() - started)
    for note in notes:  # before the table: what the rows below are measured against
        print(note, file=sys.stderr if args.quiet else sys.stdout)
    if args.quiet:
        score, total = totals(results)
        print(f"score: {score} / {total}")
    else:
        print_table(lab, results, verbose=args.verbose)
    return 0


#: What ``make list``'s tags mean: what the lab's make target installs before grading.
REQUIRES = {
    "core": "numpy, pytest, hypothesis, rich: quick to install, any laptop",
    "torch": "also torch (CPU build) and triton; the kernels run in Triton's interpreter "
    "without a GPU",
    "model": "also transformers, gguf and the SmolLM2-135M checkpoint (93 MB), for the real model",
}


def _list(_: list[str]) -> int:
    written = {lab.id: lab for lab in available_labs()}
    for lab_id, slug in PLANNED_LABS.items():
        lab = written.get(lab_id)
        state = f"{lab.title} [{lab.requires}]" if lab else "not written yet"
        print(f"{lab_id}-{slug:24s} {state}")
    print("\n[tag]: what `make lab-NN` installs into .venv before it grades:")
    for tag, meaning in REQUIRES.items():
        print(f"  [{tag}] {meaning}")
    return 0


def _reset(argv: list[str]) -> int:
    from grading.stubs import reset_lab

    parser = argparse.ArgumentParser(prog="python -m grading reset")
    parser.add_argument("lab")
    parser.add_argument(
        "--force", action="store_true", help="replace edited files (each is backed up first)"
    )
    args = parser.parse_args(argv)
    try:
        return reset_lab(load_lab(args.lab), force=args.force)
    except LabNotFound as exc:
        print(f"grading: {exc}", file=sys.stderr)
        return 2


def _stubs(argv: list[str]) -> int:
    from grading.stubs import check_or_write_stubs

    parser = argparse.ArgumentParser(prog="python -m grading stubs")
    parser.add_argument("--check", action="store_true", help="fail if a stub is out of date")
    parser.add_argument(
        "--force", action="store_true", help="replace edited files too (each is backed up first)"
    )
    parser.add_argument("labs", nargs="*")
    args = parser.parse_args(argv)
    labs = [load_lab(n) for n in args.labs] if args.labs else available_labs()
    return check_or_write_stubs(labs, check=args.check, force=args.force)


def _sync(argv: list[str]) -> int:
    from grading.sync import solution_drift, update_solution

    parser = argparse.ArgumentParser(prog="python -m grading sync")
    parser.add_argument("--write", action="store_true", help="rewrite solutions from the reference")
    parser.add_argument("labs", nargs="*")
    args = parser.parse_args(argv)
    labs = [load_lab(n) for n in args.labs] if args.labs else available_labs()
    if args.write:
        for lab in labs:
            for path in update_solution(lab):
                print(f"{path}: updated from the reference")
        return 0
    problems = [p for lab in labs for p in solution_drift(lab)]
    print("\n".join(problems) or "solutions match the reference")
    return 1 if problems else 0


def _check_suites(argv: list[str]) -> int:
    from grading.check_suites import check_lab, print_verdicts

    parser = argparse.ArgumentParser(prog="python -m grading check-suites")
    parser.add_argument("labs", nargs="*")
    args = parser.parse_args(argv)
    labs = [load_lab(n) for n in args.labs] if args.labs else available_labs()
    all_ok = True
    for lab in labs:
        verdicts = check_lab(lab)
        print_verdicts(lab, verdicts)
        all_ok &= all(v.ok for v in verdicts)
    return 0 if all_ok else 1


def _autograder(argv: list[str]) -> int:
    from grading.autograder import build_autograder

    parser = argparse.ArgumentParser(prog="python -m grading autograder")
    parser.add_argument("labs", nargs="*", help="default: every lab")
    parser.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    labs = [load_lab(n) for n in args.labs] if args.labs else available_labs()
    for lab in labs:
        print(
            f"{build_autograder(lab, args.out)}: upload to Gradescope as the autograder of "
            f"{lab.id} (submission: {', '.join(lab.files)})"
        )
    return 0


def _gather_submission(argv: list[str]) -> int:
    from grading.autograder import gather_submission

    parser = argparse.ArgumentParser(
        prog="python -m grading gather-submission",
        description="run_autograder's copy of the lab's files out of Gradescope's submission",
    )
    parser.add_argument("submission", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    for path in gather_submission(args.submission, args.dest, args.names):
        print(f"graded: {path.relative_to(args.submission)!r}")
    return 0


COMMANDS = {
    "autograder": _autograder,
    "gather-submission": _gather_submission,
    "list": _list,
    "reset": _reset,
    "stubs": _stubs,
    "sync": _sync,
    "check-suites": _check_suites,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return _grade(argv)


if __name__ == "__main__":
    sys.exit(main())
