"""Integer arithmetic every layer of the engine needs (upstream: ``vllm/utils/math_utils.py``)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def cdiv(a: T, b: int) -> T:
    """Ceiling division: how many ``b``-sized blocks hold ``a`` items (``cdiv(17, 16) == 2``).

    Written as ``-(-a // b)`` so that it stays exact for integers of any size (no float) and
    works elementwise on a numpy array of lengths, which ``prepare_inputs`` relies on.
    """
    return -(-a // b)  # type: ignore[operator]
