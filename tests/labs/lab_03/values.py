"""Reading what lab-03's formulas return: plain data from the learner process, checked here.

Byte and block counts must be whole numbers: the engine sizes tensors with them, and a count
that comes back as a float (``/`` instead of ``//``, ``np.ceil``) breaks it even when it equals
the right number. A numpy integer is accepted as a whole number; a ``bool``, a float or a learner
object is not.
"""

from __future__ import annotations

import numbers
from typing import Any

from tests.labs.common import describe


def whole(value: Any, what: str) -> int:
    """``value`` as an ``int`` if it is a whole number (an int, or a numpy integer), else a
    failure: a byte or block count that comes back as a float (``/`` instead of ``//``,
    ``np.ceil``) cannot size the engine's tensors, even when it equals the right number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        shown = (
            f"{describe(value)} = {value!r}"
            if isinstance(value, numbers.Number) and type(value) not in (bool, int, float)
            else describe(value)
        )
        raise AssertionError(f"{what} must be a whole number (an int), got {shown}")
    return int(value)


def dims_of(got: Any, name: str) -> tuple[int, int, int]:
    """What ``kv_cache_dims`` returned, as three ints (a tuple or list of whole numbers)."""
    if not isinstance(got, tuple | list) or len(got) != 3:
        raise AssertionError(
            f"{name}: kv_cache_dims returns (layers, kv_heads, head_dim), got {describe(got)}"
        )
    layers, kv_heads, head_dim = (whole(x, f"{name}: each of kv_cache_dims") for x in got)
    return layers, kv_heads, head_dim
