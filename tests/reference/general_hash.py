"""The engine's former general block-hash encoder, kept as the oracle for its fixed layout.

Until issue #19, ``mini_vllm.core.kv_cache_utils.sha256`` serialised any value built of
``None``, ``bool``, integers, ``str``, ``bytes`` and tuples/lists of them. The engine only ever
hashes a block ``(parent_hash, token_ids, extra_keys)`` and a seed string, so it now encodes
exactly that layout; this module is the old encoder, unchanged, so that
``tests/reference/test_block_hash_layout.py`` can prove that every block the engine hashes
still gets the digest it had (a prefix-cache hash is a format: processes that share a cache,
or a cache that outlives an upgrade, must agree on it).
"""

from __future__ import annotations

import hashlib
import numbers
import struct
from typing import Any

_INT64 = struct.Struct(">q")
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _is_integer(value: object) -> bool:
    # numpy integers are Integral but not int; bool is an int we want to keep distinct.
    return type(value) is int or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    )


_INT_ONLY = frozenset({int})


def _all_integers(values: tuple[Any, ...] | list[Any]) -> bool:
    # The hot path is a block of plain ints: collecting their types runs in C, without a Python
    # call per token (the generator below costs ~1 µs per 16-token block, per block hashed).
    return set(map(type, values)) <= _INT_ONLY or all(_is_integer(item) for item in values)


def _encode(value: object, out: list[bytes]) -> None:
    """Append the canonical encoding of ``value`` to ``out``.

    Every encoding starts with a one-byte type tag and variable-size payloads carry their length,
    so distinct values never share an encoding (``(1, 23)`` differs from ``(12, 3)``, ``True``
    from ``1``, ``"a"`` from ``b"a"``). The chosen encoding depends only on the value: a sequence
    whose items are all integers fitting in 64 bits is packed as one array (the hot path: every
    block of token ids), any other sequence is encoded item by item.
    """
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"T" if value else b"F")
    # Containers, bytes and str are tested before the integers: no value is both, and the
    # integer test is an ABC isinstance for anything but a plain int, the slowest test here
    # (a block's hash would pay it twice: for the parent hash and for the token tuple).
    elif isinstance(value, (tuple, list)):
        header = len(value).to_bytes(8, "big")
        if _all_integers(value):
            try:
                out.append(b"q" + header + struct.pack(f">{len(value)}q", *value))
                return
            except struct.error:
                pass  # an item does not fit in 64 bits: fall back to item by item
        out.append(b"t" + header)
        for item in value:
            _encode(item, out)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        payload = bytes(value)
        out.append(b"b" + len(payload).to_bytes(8, "big") + payload)
    elif isinstance(value, str):
        payload = value.encode("utf-8")
        out.append(b"s" + len(payload).to_bytes(8, "big") + payload)
    elif _is_integer(value):
        number = int(value)  # type: ignore[call-overload]
        if _INT64_MIN <= number <= _INT64_MAX:
            out.append(b"i" + _INT64.pack(number))
        else:
            payload = number.to_bytes((number.bit_length() + 8) // 8, "big", signed=True)
            out.append(b"I" + len(payload).to_bytes(8, "big") + payload)
    else:
        raise TypeError(
            f"Cannot hash a value of type {type(value).__name__} for prefix caching: only None, "
            "bool, int, str, bytes and tuples/lists of them have a canonical encoding"
        )


def sha256(input: Any) -> bytes:
    """Hash ``input`` with SHA-256 over a canonical byte encoding; return the 32-byte digest.

    Prefix-cache hits are only correct if equal inputs hash equally in every process that shares
    the cache, and only safe if unequal inputs practically never collide. A cryptographic digest
    of an injective, platform-independent encoding gives both; pickle (upstream's ``sha256``)
    is neither guaranteed canonical nor stable across Python versions.
    """
    parts: list[bytes] = []
    _encode(input, parts)
    return hashlib.sha256(b"".join(parts)).digest()
