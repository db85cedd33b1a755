"""Where each name of a Python file is defined: the index both upstream tools read.

:mod:`ast` finds every definition of a file (``Class.method`` included) with its line and span.
``tools/check_citations.py`` checks the course's ``vllm/<path>.py:<line>`` citations against it,
and ``tools/fetch_upstream.py`` prints the line of each key upstream definition after ``make
upstream``. It lives in a module of its own so that those two never import each other; like them
it uses the standard library only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class Definition:
    """Where a name is defined in an upstream file.

    ``line`` is the ``class``/``def`` line or an assignment's first line; ``first``..``last``
    is the whole span, decorators included (the lines a range citation may cover).
    """

    qualname: str
    line: int
    first: int
    last: int


class Ambiguous(LookupError):
    """A bare name matches several definitions; the citation must qualify it."""

    def __init__(self, name: str, candidates: Sequence[str]) -> None:
        super().__init__(name)
        self.name = name
        self.candidates = list(candidates)


class SymbolIndex:
    """Every definition of one Python file, by qualified name (``Class.method``).

    Built once per file and cached, since a chapter cites the same few files many times.
    Module-level ``if``/``try`` blocks are walked (``if TYPE_CHECKING:`` definitions count);
    function bodies contribute nested functions and classes, never local variables.
    """

    _cache: ClassVar[dict[Path, SymbolIndex]] = {}

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.num_lines = source.count("\n") + (0 if source.endswith("\n") else 1)
        self.definitions: dict[str, list[Definition]] = {}
        self._module = ".".join(path.with_suffix("").parts)
        self._walk(ast.parse(source, filename=str(path)).body, prefix="", in_function=False)

    @classmethod
    def for_file(cls, path: Path) -> SymbolIndex:
        """The (cached) index of ``path``."""
        key = path.resolve()
        if key not in cls._cache:
            cls._cache[key] = cls(path, path.read_text(encoding="utf-8"))
        return cls._cache[key]

    def _add(self, qualname: str, node: ast.AST, line: int) -> None:
        decorators = getattr(node, "decorator_list", [])
        first = min([line, *(d.lineno for d in decorators)])
        last = getattr(node, "end_lineno", None) or line
        self.definitions.setdefault(qualname, []).append(Definition(qualname, line, first, last))

    def _walk(self, body: Iterable[ast.stmt], prefix: str, in_function: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + node.name
                self._add(qualname, node, node.lineno)
                self._walk(
                    node.body,
                    prefix=qualname + ".",
                    in_function=isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)),
                )
            elif in_function:
                continue
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in _assigned_names(target):
                        self._add(prefix + name, node, node.lineno)
            elif isinstance(node, (ast.If, ast.Try, ast.With)) or (
                sys.version_info >= (3, 11) and isinstance(node, ast.TryStar)
            ):
                for block in _sub_blocks(node):
                    self._walk(block, prefix, in_function)

    def lookup(self, name: str) -> list[Definition] | None:
        """All definitions of ``name``, or None; raises :class:`Ambiguous` for a vague name.

        ``name`` may be qualified (``BlockPool.touch``), prefixed by the module's dotted path
        (``block_pool.BlockPool``, ``vllm.v1.core.block_pool.BlockPool``), or a bare name that
        only one definition in the file ends with (``get_new_blocks``).
        """
        for candidate in self._spellings(name):
            if candidate in self.definitions:
                return self.definitions[candidate]
        matches = sorted(q for q in self.definitions if q.endswith("." + name))
        if len(matches) == 1:
            return self.definitions[matches[0]]
        if matches:
            raise Ambiguous(name, matches)
        return None

    def resolve(self, name: str) -> Definition | None:
        """The main definition of ``name`` (the last one: an overload's implementation)."""
        try:
            found = self.lookup(name)
        except Ambiguous:
            return None
        return found[-1] if found else None

    def _spellings(self, name: str) -> Iterator[str]:
        yield name
        module_parts = self._module.split(".")
        parts = name.split(".")
        for i in range(1, len(parts)):
            if parts[:i] == module_parts[-i:]:
                yield ".".join(parts[i:])

    def innermost(self, line: int) -> Definition | None:
        """The smallest definition whose span holds ``line`` (for hints)."""
        best: Definition | None = None
        for definitions in self.definitions.values():
            for d in definitions:
                if not d.first <= line <= d.last:
                    continue
                if best is None or d.last - d.first < best.last - best.first:
                    best = d
        return best


def _assigned_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _assigned_names(element)


def _sub_blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    for attr in ("body", "orelse", "finalbody"):
        block = getattr(node, attr, None)
        if block:
            yield block
    for handler in getattr(node, "handlers", []):
        yield handler.body
