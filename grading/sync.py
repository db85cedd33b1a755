"""Solutions are the reference, symbol for symbol; this module checks and restores that.

A lab's solution file holds copies of reference classes, functions and module-level constants
(``lab.json`` names the reference modules). ``solution_drift`` reports every copied symbol whose
code differs from the reference (compared as ASTs, docstrings included), and ``update_solution``
rewrites the copies from the reference, keeping the solution's own header (module docstring and
imports). Constants count: a tuned launch default or a hash seed that drifted would make the
solution, and the stubs made from it, behave unlike the reference. The one translation allowed is
``lab.read_through``: a global the reference rebinds after import is read in the solution as
``module.NAME`` (the name alone, imported into the lab file, would keep the value of import time).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
from pathlib import Path

from grading.labs import Lab

Symbol = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | ast.AnnAssign


def _name(node: ast.stmt) -> str | None:
    """The name a top-level statement defines, if it is a definition or ``NAME = ...``."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
    ):
        return node.targets[0].id
    return None


def _symbols(tree: ast.Module) -> dict[str, Symbol]:
    found: dict[str, Symbol] = {}
    for node in tree.body:
        name = _name(node)
        if name is not None and isinstance(node, Symbol):
            found[name] = node
    return found


class _BareNames(ast.NodeTransformer):
    """``module.NAME`` read back as ``NAME`` for the read-through globals (to compare)."""

    def __init__(self, read_through: dict[str, str]) -> None:
        self.read_through = read_through

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if (
            isinstance(node.value, ast.Name)
            and self.read_through.get(node.attr) == node.value.id
            and isinstance(node.ctx, ast.Load)
        ):
            return ast.copy_location(ast.Name(id=node.attr, ctx=ast.Load()), node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.read_through and isinstance(node.ctx, ast.Load):
            # A bare read in the solution is the stale copy the translation exists to avoid.
            return ast.copy_location(ast.Name(id=f"<bare {node.id}>", ctx=ast.Load()), node)
        return node


def _as_reference(node: Symbol, read_through: dict[str, str]) -> str:
    if not read_through:
        return ast.dump(node)
    return ast.dump(_BareNames(read_through).visit(copy.deepcopy(node)))


def _read_through(node: Symbol, lines: list[str], read_through: dict[str, str]) -> list[str]:
    """The reference symbol's source ``lines`` (numbered as in its module) with each bare read of
    a read-through global written ``module.NAME``; docstrings and comments stay as they are."""
    uses = [
        name
        for name in ast.walk(node)
        if isinstance(name, ast.Name) and name.id in read_through and isinstance(name.ctx, ast.Load)
    ]
    for name in sorted(uses, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        line = lines[name.lineno - 1].encode()  # col_offset counts UTF-8 bytes
        column, prefix = name.col_offset, f"{read_through[name.id]}.".encode()
        lines[name.lineno - 1] = (line[:column] + prefix + line[column:]).decode()
    return lines


def _reference_symbols(lab: Lab) -> dict[str, tuple[str, Symbol]]:
    found: dict[str, tuple[str, Symbol]] = {}
    for module_name in lab.reference:
        source = inspect.getsource(importlib.import_module(module_name))
        for name, node in _symbols(ast.parse(source)).items():
            found.setdefault(name, (source, node))
    return found


def _span(node: Symbol, lines: list[str]) -> tuple[int, int]:
    """The symbol's lines, decorators included. A constant also takes the comment lines right
    above it: a constant's why lives there (a definition has its docstring, and the comment
    above a definition is the solution's own, e.g. a lab's section heading)."""
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno] + [d.lineno for d in decorators]) - 1
    if isinstance(node, ast.Assign | ast.AnnAssign):
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
    return start, node.end_lineno or node.lineno


def solution_drift(lab: Lab) -> list[str]:
    """Every way the lab's solution files differ from the reference."""
    reference = _reference_symbols(lab)
    problems = []
    for filename in lab.files:
        path = lab.solution_dir / filename
        tree = ast.parse(path.read_text())
        for name, node in _symbols(tree).items():
            if name not in reference and isinstance(node, ast.Assign | ast.AnnAssign):
                continue  # the solution's own constant (e.g. a quiz's answers)
            if name not in reference:
                refs = ", ".join(lab.reference)
                problems.append(f"{path}: {name} is not in the reference ({refs})")
            elif _as_reference(node, lab.read_through) != ast.dump(reference[name][1]):
                problems.append(
                    f"{path}: {name} differs from the reference "
                    f"(run `python -m grading sync --write`)"
                )
    return problems


def update_solution(lab: Lab) -> list[Path]:
    """Rewrite each copied symbol of the lab's solutions from the reference."""
    reference = _reference_symbols(lab)
    changed = []
    for filename in lab.files:
        path = lab.solution_dir / filename
        text = path.read_text()
        lines = text.splitlines()
        for name, node in sorted(_symbols(ast.parse(text)).items(), key=lambda kv: -kv[1].lineno):
            if name not in reference:
                continue
            ref_source, ref_node = reference[name]
            ref_lines = _read_through(ref_node, ref_source.splitlines(), lab.read_through)
            r_start, r_end = _span(ref_node, ref_lines)
            start, end = _span(node, lines)
            lines[start:end] = ref_lines[r_start:r_end]
        new = "\n".join(lines) + "\n"
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
