"""The messages a grading child sends its parent: one JSON object per line.

Each line carries the run's nonce, which the parent hands the child on stdin before any
graded code is imported; a line without it is ignored, so printing or writing fake
results from graded code forges nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1500


def encode(nonce: str, event: str, **fields: Any) -> bytes:
    return (json.dumps({"nonce": nonce, "event": event, **fields}) + "\n").encode()


def decode(line: bytes, nonce: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or obj.get("nonce") != nonce:
        return None
    return obj


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 20] + "\n… (truncated)"


@dataclass
class TestInfo:
    """A graded test as collected (in a process that ran no graded code)."""

    nodeid: str
    name: str
    points: int
    hint: str
    doc: str
    visibility: str = "visible"
    gpu: bool = False
    description: str = ""


@dataclass
class TestResult:
    info: TestInfo
    outcome: str
    message: str = ""
    duration: float = 0.0

    @property
    def score(self) -> int:
        return self.info.points if self.outcome == "passed" else 0
