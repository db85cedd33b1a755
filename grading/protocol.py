"""The messages the judge sends the grader: one JSON object per line on a private pipe.

Only the judge holds the pipe (the learner process is a separate, sandboxed process that never
inherits it), so no nonce is needed. The grader still treats every line as untrusted input: a
line that is too long, not JSON, or not one of the events below with fields of the right
types is dropped, never allowed to raise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1500
MAX_LINE = 4 * 1024 * 1024
_STR, _NUM = (str,), (int, float)
#: event -> {field: allowed types}; every field listed must be present.
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "start": {"nodeid": _STR},
    "result": {"nodeid": _STR, "outcome": _STR, "message": _STR, "duration": _NUM},
    "preflight": {"status": _STR, "message": _STR},
    "collected": {"tests": (list,), "ungraded": (list,), "errors": (list,)},
    "done": {},
}


def encode(event: str, **fields: Any) -> bytes:
    return (json.dumps({"event": event, **fields}) + "\n").encode()


def decode(line: bytes) -> dict[str, Any] | None:
    """The event on ``line``, or None if it is not a well-formed one."""
    if len(line) > MAX_LINE:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    fields = SCHEMA.get(obj.get("event"))  # type: ignore[arg-type]
    if fields is None:
        return None
    for name, types in fields.items():
        value = obj.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            return None
    return obj


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 20] + "\n… (truncated)"


@dataclass
class TestInfo:
    """A graded test as collected (in a process that ran no graded code)."""

    __test__ = False  # not a pytest test class

    nodeid: str
    name: str
    points: int
    hint: str
    doc: str
    visibility: str = "visible"
    gpu: bool = False
    description: str = ""
    timeout: float | None = None  # the test's own limit; None: the lab's

    def time_limit(self, lab_timeout: float) -> float:
        """Seconds this test may run: its own ``@graded(timeout=)``, else the lab's."""
        return lab_timeout if self.timeout is None else self.timeout


def printable(text: str) -> str:
    """``text`` with every character a terminal could obey (escape sequences, C1 controls,
    carriage returns) written out as ``\\xNN``; newlines stay."""
    return "".join(ch if ch == "\n" or ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


@dataclass
class TestResult:
    """One test's verdict. Its message carries learner text (exception messages, output), so
    it is made printable here, once, for every layout that shows it: a message can then never
    move a terminal's cursor, clear its screen or draw a score of its own."""

    __test__ = False  # not a pytest test class

    info: TestInfo
    outcome: str
    message: str = ""
    duration: float = 0.0

    def __post_init__(self) -> None:
        self.message = printable(self.message)

    @property
    def score(self) -> int:
        return self.info.points if self.outcome == "passed" else 0
