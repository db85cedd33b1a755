"""The ground truth of the lab-06 suite, written independently of the learner's file.

Attention is computed the slowest, most literal way: one query row and one head at a time, over
keys the test itself laid out contiguously, in float64. Nothing here calls the learner's code
(not even the ``dense_attention`` their file is given), so a broken helper in their file cannot
vouch for itself. Caches are filled by the test too (:func:`write_paged`), so a decode test does
not depend on the learner's ``reshape_and_cache``.

The learner's results arrive from the learner process by value (numpy arrays stay numpy arrays,
with their dtype); :func:`as_array` refuses anything else before a comparison. The tests reach
the learner's module through :func:`pa`, which fails a call that rewrote an array it was given
to read: those arrays are copied back into the test's, and the oracle reads them afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grading.suite import load_impl
from tests.labs.common import describe, reading_only

#: The arrays each of the learner's functions may change: reshape_and_cache's two caches.
WRITES = {"reshape_and_cache": (2, 3, "key_cache", "value_cache")}


def pa() -> Any:
    """The learner's module; its functions may write only the caches given to
    ``reshape_and_cache`` (every test's expectation comes from arrays it keeps)."""
    return reading_only(load_impl("paged_attention_numpy"), WRITES)


def as_array(got: Any, what: str) -> np.ndarray:
    """The learner's result as a numpy array: an array, or a list or tuple of numbers."""
    if isinstance(got, np.ndarray):
        return got
    if isinstance(got, list | tuple):
        array = np.asarray(got)
        if array.dtype != object:
            return array
    raise AssertionError(f"{what}: expected a numpy array, got {describe(got)}")


def attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    scale: float,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """Softmax attention of ``query [q, H, D]`` over ``key, value [k, KV, D]``.

    ``positions[i]`` is query ``i``'s position: it sees keys ``0 .. positions[i]`` (causal).
    ``None`` means every key is visible (decode). Query head ``h`` reads KV head
    ``h // (H // KV)``.
    """
    q_len, num_heads, _ = query.shape
    k_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    out = np.zeros(query.shape, dtype=np.float64)
    for i in range(q_len):
        visible = k_len if positions is None else int(positions[i]) + 1
        for h in range(num_heads):
            kv = h // group
            scores = np.array(
                [float(np.dot(query[i, h], key[t, kv])) * scale for t in range(visible)]
            )
            weights = np.exp(scores - scores.max())
            weights /= weights.sum()
            out[i, h] = weights @ value[:visible, kv]
    return out


@dataclass
class Paged:
    """Sequences' K/V written into a garbage-filled paged cache through random block tables."""

    keys: list[np.ndarray]  # per sequence [seq_len, KV, D], contiguous
    values: list[np.ndarray]
    key_cache: np.ndarray  # [num_blocks, block_size, KV, D]
    value_cache: np.ndarray
    tables: np.ndarray  # [num_seqs, max_blocks], padded past each sequence's blocks
    seq_lens: np.ndarray
    block_size: int


def write_paged(
    rng: np.random.Generator,
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    spare_blocks: int = 3,
    table_pad: int = -1,
    extra_columns: int = 1,
) -> Paged:
    """Lay sequences out in a cache whose other slots hold random garbage.

    Block ids are a random permutation of the pool, so neighbouring logical blocks are never
    neighbours in the cache; every slot a sequence does not own (the rest of its last block
    included) holds values unrelated to it.
    """
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(used) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = rng.standard_normal(shape) * 3.0
    value_cache = rng.standard_normal(shape) * 3.0
    perm = rng.permutation(num_blocks)
    width = max(used) + extra_columns
    tables = np.full((len(seq_lens), width), table_pad, dtype=np.int64)
    keys, values = [], []
    start = 0
    for i, (n, u) in enumerate(zip(seq_lens, used)):
        tables[i, :u] = perm[start : start + u]
        start += u
        k = rng.standard_normal((n, num_kv_heads, head_dim))
        v = rng.standard_normal((n, num_kv_heads, head_dim))
        for p in range(n):
            block, offset = tables[i, p // block_size], p % block_size
            key_cache[block, offset] = k[p]
            value_cache[block, offset] = v[p]
        keys.append(k)
        values.append(v)
    return Paged(keys, values, key_cache, value_cache, tables, np.array(seq_lens), block_size)


def assert_close(got: np.ndarray, want: np.ndarray, tol: float, rule: str) -> None:
    """Fail with the worst element, the rule it breaks, and where it is."""
    got = as_array(got, rule)
    if got.shape != want.shape:
        raise AssertionError(f"{rule}: output shape {got.shape}, expected {want.shape}")
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0].tolist()
        raise AssertionError(
            f"{rule}: output holds inf/nan, first at index {bad} "
            "(exp overflowed? a division by a zero sum?)"
        )
    err = np.abs(got.astype(np.float64) - want)
    worst = float(err.max()) if err.size else 0.0
    if worst > tol:
        where = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(
            f"{rule}: max |got - expected| = {worst:.3g} > {tol:g} at index "
            f"{tuple(int(i) for i in where)} (got {float(got[where]):.6g}, expected "
            f"{float(want[where]):.6g})"
        )


def _furthest_in_ulps(
    got: np.ndarray, want: np.ndarray, rule: str, dtype: type, allowed: float
) -> tuple[np.ndarray, tuple[int, ...], float] | None:
    """``None`` if ``got`` is within ``allowed`` ulps of ``dtype`` of the float64 answer
    ``want`` everywhere; else ``got`` as an array, the index where it is furthest, and how many
    ulps off it is there."""
    got = as_array(got, rule)
    if got.shape != want.shape:
        raise AssertionError(f"{rule}: output shape {got.shape}, expected {want.shape}")
    err = np.abs(got.astype(np.float64) - want)
    ulp = np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    if not err.size or np.all(err <= allowed * ulp + 1e-12):
        return None
    excess = err / ulp
    where = np.unravel_index(int(excess.argmax()), excess.shape)
    return got, tuple(int(i) for i in where), float(excess[where])


def assert_rounded_once(got: np.ndarray, want: np.ndarray, rule: str) -> None:
    """``got`` (float32) is the float64 answer ``want`` rounded once to float32: within half a
    float32 ulp of it. Computing a float32 query over float64 keys in float32 (the keys cast
    to the query's dtype) misses by several ulps; computing in float64 (``_compute_dtype``)
    and casting the result, as the README says, does not."""
    off = _furthest_in_ulps(got, want, rule, np.float32, 0.5)
    if off is not None:
        got, where, ulps = off
        raise AssertionError(
            f"{rule}: at index {where} got {float(got[where]):.9g}, {ulps:.1f} float32 ulps "
            f"from the float64 answer {float(want[where]):.9g}: a float32 query over float64 "
            "keys is computed in float64 (_compute_dtype of all the inputs) and only the result "
            "is rounded to the query's float32; casting the keys to the query's dtype, or "
            "scaling the query in float32, rounds every score to float32 first"
        )


def assert_half_computed_in_float32(got: np.ndarray, want: np.ndarray, rule: str) -> None:
    """``got`` (float16) is within one float16 ulp of ``want``, the float64 answer over the same
    float16 inputs. Computed in float32 (``_compute_dtype``) and rounded once, an output is off
    by half an ulp and a float32 rounding error; computed in float16 (the scores, the softmax
    sum, the weighted values), it is off by tens of ulps. One ulp, not half: legal float32
    arithmetic in another order may land across a float16 rounding boundary."""
    off = _furthest_in_ulps(got, want, rule, np.float16, 1.0)
    if off is not None:
        got, where, ulps = off
        raise AssertionError(
            f"{rule}: at index {where} got {float(got[where]):.6g}, {ulps:.1f} float16 ulps "
            f"from the float64 answer {float(want[where]):.6g}: float16 inputs are computed in "
            "float32 (_compute_dtype: the scores, the softmax and its sum, the weighted values) "
            "and only the result is rounded to float16; arithmetic in float16 loses about three "
            "digits"
        )
