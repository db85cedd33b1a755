"""The reference split-K decode in numpy (lab-06, part 3): exact against plain decode."""

from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.teaching.paged_attention_numpy import (
    attend_split,
    merge_splits,
    paged_attention_decode,
    paged_attention_decode_split_k,
)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64])
def test_split_k_equals_decode(num_splits):
    rng = np.random.default_rng(num_splits)
    key_cache = rng.standard_normal((24, 4, 2, 8))
    value_cache = rng.standard_normal((24, 4, 2, 8))
    tables = np.stack([rng.permutation(24)[:9] for _ in range(3)])
    seq_lens = np.array([1, 13, 36])
    query = rng.standard_normal((3, 6, 8))
    want = paged_attention_decode(query, key_cache, value_cache, tables, seq_lens, 0.3)
    got = paged_attention_decode_split_k(
        query, key_cache, value_cache, tables, seq_lens, 0.3, num_splits
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_empty_split_and_large_lse():
    partial, lse = attend_split(np.ones((2, 4)), np.zeros((0, 1, 4)), np.zeros((0, 1, 4)), 1.0)
    assert np.all(partial == 0) and np.all(lse == -np.inf)
    merged = merge_splits(
        np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[np.nan, 1.0]]]),
        np.array([[900.0], [900.0 + np.log(3.0)], [-np.inf]]),
    )
    np.testing.assert_allclose(merged, [[0.25, 0.75]], atol=1e-12)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="finite lse"):
        merge_splits(np.zeros((1, 1, 2)), np.array([[-np.inf]]))
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention_decode_split_k(
            np.zeros((1, 1, 2)),
            np.zeros((2, 2, 1, 2)),
            np.zeros((2, 2, 1, 2)),
            np.zeros((1, 1), int),
            np.array([1]),
            1.0,
            0,
        )
