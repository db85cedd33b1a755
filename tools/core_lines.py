"""How long the engine core is: lines of code, docstrings, comments and blanks per package.

The engine core is every module of ``mini_vllm`` except the kernels (``attention/``,
``model/triton_ops.py``) and the teaching code (``teaching/``): what a reader has to get through
to understand the engine. Issue #19 set its size as a target, so it is measured one way, here.
``--base REV`` counts the same set at a git revision too and prints the change.

    python tools/core_lines.py --base 9b69037
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections import Counter
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("code", "docstring", "comment", "blank")


def is_core(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        path.endswith(".py")
        and parts[0] == "mini_vllm"
        and "teaching" not in parts
        and "attention" not in parts
        and parts[-1] != "triton_ops.py"
    )


def classify(source: str) -> Counter[str]:
    """Count each line of one module as code, docstring, comment or blank."""
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstring_lines.update(range(first.lineno, (first.end_lineno or 0) + 1))
    counts: Counter[str] = Counter()
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if number in docstring_lines:
            counts["docstring"] += 1
        elif not stripped:
            counts["blank"] += 1
        elif stripped.startswith("#"):
            counts["comment"] += 1
        else:
            counts["code"] += 1
    return counts


def package(path: str) -> str:
    parts = PurePosixPath(path).parts
    return "/".join(parts[:2]) if len(parts) > 2 else "mini_vllm (top level)"


def count(rev: str | None) -> dict[str, Counter[str]]:
    """Per package counts of the working tree (``rev`` None) or of a git revision."""
    if rev is None:
        files = {
            p.relative_to(ROOT).as_posix(): p.read_text()
            for p in (ROOT / "mini_vllm").rglob("*.py")
        }
    else:
        listing = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", rev, "mini_vllm"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files = {
            f: subprocess.run(
                ["git", "show", f"{rev}:{f}"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout
            for f in listing
            if f.endswith(".py")
        }
    result: dict[str, Counter[str]] = {}
    for path, source in sorted(files.items()):
        if is_core(path):
            result.setdefault(package(path), Counter()).update(classify(source))
    return result


def total(counts: dict[str, Counter[str]]) -> Counter[str]:
    return sum(counts.values(), Counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="also count this git revision and print the change")
    args = parser.parse_args()
    now = count(None)
    base = count(args.base) if args.base else None
    header = "| package | lines | " + " | ".join(KINDS) + " |"
    if base is not None:
        header += f" lines at {args.base} | change |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    rows = [*sorted(now), "**total**"]
    for name in rows:
        c = total(now) if name == "**total**" else now[name]
        cells = [str(c.total())] + [str(c[k]) for k in KINDS]
        if base is not None:
            b = total(base) if name == "**total**" else base.get(name, Counter())
            change = (c.total() - b.total()) / b.total() if b.total() else 0.0
            cells += [str(b.total()), f"{change:+.1%}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
