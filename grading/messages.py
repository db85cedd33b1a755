"""What a learner reads for a failed test: the test's own message, without pytest's noise.

The judge turns the exception that ended a test into one short paragraph. Three sources of
noise are removed here, each of which once pushed the hint and the "read:" link off the
screen:

* pytest's assertion rewriting appends ``assert <expr>`` and ``+  where …`` lines to a message
  the test already wrote; when the test gives a message, only that message is kept. A bare
  ``assert`` keeps its comparison, prefixed by the statement that failed (so the learner sees
  *what* was compared), and drops the ``where`` lines and ``Use -v to get more diff``.
* Hypothesis reports a failing run as notes on the exception (``state = Machine()``, one
  ``Draw`` line per value, ``state.teardown()``, an explanation) and, when it finds several
  distinct failures, as an ``ExceptionGroup`` that says only how many. The first failure is
  shown, with its shrunk steps in one compact line each (``allocate(n=3)``).
* Learner objects print through their own ``repr``; a ``KVCacheBlock`` with its neighbours is
  two lines of text. Blocks are shown as ``<block 3 ref_cnt=1>`` (``<sentinel>`` for id -1).
"""

from __future__ import annotations

import re
import traceback

#: Longest compact step list kept (the shrunk sequences of the suites are far shorter).
MAX_STEPS = 12

_BLOCK_REPR = re.compile(
    r"KVCacheBlock\(block_id=(-?\d+), ref_cnt=(-?\d+)(?:, _block_hash=(None|b?'[^']*'|[^,()]*))?"
    r"[^()]*?\)"
)
_DRAW = re.compile(
    r"^Draw \d+(?: \((?P<label>[^)]*)\))?: (?P<value>.*?)(?:\s+# or any other "
    r"generated value)?$"
)  # the comment is gone by then; kept for notes read raw
_STEP = re.compile(r"^state\.(?P<rule>\w+)\((?P<args>.*)\)$")
_COMMENT = re.compile(r"\s+# or any other generated value$")
_EXAMPLE = re.compile(r"^\s*(?:Falsifying example|Failing test case): (?!<state machine>)")
_NOISE = ("Use -v to get more diff", "Use -vv to get more diff", "Full diff:")


def short_block(match: re.Match[str]) -> str:
    block_id, ref_cnt, block_hash = match.group(1), match.group(2), match.group(3)
    if block_id == "-1":
        return "<sentinel>"
    cached = " cached" if block_hash not in (None, "None") else ""
    return f"<block {block_id} ref_cnt={ref_cnt}{cached}>"


def short_reprs(text: str) -> str:
    """Long ``KVCacheBlock(...)`` reprs (the reference's, which names neighbours) made short."""
    return _BLOCK_REPR.sub(short_block, text)


def clean_assertion(message: str, statement: str | None = None) -> str:
    """The test's own message; for a bare ``assert``, the statement and the comparison.

    ``message`` is ``str()`` of an ``AssertionError`` raised by a rewritten assert: the test's
    message (if any), then ``assert <explanation>`` and ``+  where`` lines.
    """
    lines = message.strip().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("assert ")), None)
    if cut is None:  # raised by hand (common.py's checks) or not rewritten: all of it is ours
        return "\n".join(line for line in lines if line.strip() not in _NOISE).strip()
    if cut > 0:  # the test's message, then pytest's explanation: the message says it
        return "\n".join(lines[:cut]).strip()
    kept = [lines[0]]
    for line in lines[1:]:
        stripped = line.strip()
        if (
            stripped.startswith("+  where")
            or stripped.startswith("+    where")
            or stripped in _NOISE
            or stripped.startswith("+  and ")
            or not stripped
        ):
            continue
        kept.append(line)
    text = "\n".join(kept[:5] + (["  …"] if len(kept) > 5 else []))
    statement = (statement or "").strip()
    if statement.startswith("assert "):
        what = " ".join(statement.removeprefix("assert ").split())
        return f"check failed: {what}\n{text}"
    return text


def compact_steps(notes: list[str]) -> list[str]:
    """Hypothesis's notes for a failing run, as one line per step: ``rule(label=value, …)``.

    The machine's construction and teardown, and the explanation Hypothesis appends, are left
    out; a ``Draw`` line becomes an argument of the step it belongs to. Notes that are not a
    state machine's (``Falsifying example: test(x=1)``) are kept, joined, as they are.
    """
    steps: list[str] = []
    draws: list[str] = []
    other: list[str] = []
    lines = [_COMMENT.sub("", line).strip() for raw in notes for line in str(raw).splitlines()]
    for line in lines:
        if line.startswith("Explanation:") or line.startswith("These lines were"):
            break  # where the failing runs went in the suite: not the learner's business
        if (
            not line
            or line.startswith("# ")
            or line == "Failing test case: <state machine>"
            or line.startswith("state = ")
            or line == "state.teardown()"
        ):
            continue
        draw = _DRAW.match(line)
        if draw:
            label = draw.group("label")
            value = draw.group("value").strip()
            draws.append(f"{label}={value}" if label else value)
            continue
        step = _STEP.match(line)
        if step:
            args = [a for a in _split_args(step.group("args")) if a != "data=data(...)"]
            steps.append(f"{step.group('rule')}({', '.join(args + draws)})")
            draws = []
            continue
        if (
            line.startswith("You can reproduce")
            or line.startswith("@reproduce_failure")
            or line.startswith("Highest target score")
        ):
            continue
        other.append(line)
    if draws:  # values drawn by the last step before it failed (it never printed itself)
        steps.append(f"… ({', '.join(draws)})")
    if not steps and other:  # a @given test: "Failing test case: test_x(", "a=1,", ")"
        text = " ".join(other)
        text = re.sub(
            r"^(?:Falsifying example|Failing test case): \w+\(\s*(.*?),?\s*\)$", r"\1", text
        )
        text = re.sub(r"([(\[{])\s+", r"\1", text)
        text = re.sub(r",?\s+([)\]}])", r"\1", text)
        return [short_reprs(text)]
    if len(steps) > MAX_STEPS:
        tail = MAX_STEPS - 4
        steps = [*steps[:3], f"… ({len(steps) - 3 - tail} more steps)", *steps[-tail:]]
    return [short_reprs(s) for s in steps]


def _split_args(text: str) -> list[str]:
    """``a=1, b=[1, 2]`` split at the top-level commas."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def first_failure(exc: BaseException) -> tuple[BaseException, int]:
    """The exception to show, and how many other distinct failures Hypothesis found with it."""
    subs = getattr(exc, "exceptions", None)  # an ExceptionGroup (Python >= 3.11, or backport)
    if type(subs) is tuple and subs and isinstance(subs[0], BaseException):
        inner, others = first_failure(subs[0])
        return inner, others + len(subs) - 1
    return exc, 0


def steps_block(exc: BaseException, others: int) -> str:
    """The paragraph that replays a Hypothesis failure, or "" when there is none."""
    notes = [n for n in getattr(exc, "__notes__", []) or [] if isinstance(n, str)]
    if not notes:
        return ""
    steps = compact_steps(notes)
    if not steps:
        return ""
    more = (
        f" ({others} other distinct failure{'s' if others > 1 else ''} too: fix this one first)"
        if others
        else ""
    )
    if any(_EXAMPLE.match(n) for n in notes):
        return f"failing example{more}: {steps[0]}"
    body = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(steps))
    return f"shortest failing steps found{more}:\n{body}"


def exception_only(exc: BaseException) -> str:
    """``Type: message`` without ``__notes__`` (this module shows those its own way)."""
    notes = getattr(exc, "__notes__", None)
    try:
        if notes is not None:
            del exc.__notes__
        return "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        if notes is not None:
            exc.__notes__ = notes
