# base: solution
# lab: lab-06
# tests: test_slot_mapping_worked_example, test_decode_single_sequence_equals_dense, test_decode_applies_the_scale_once, test_decode_gqa_head_mapping
# honest: paged_attention_decode = lambda *args, **kwargs: (_ for _ in ()).throw(ValueError("no decode"))
"""Arrays passed to the learner come back into the judge's arrays (in-place kernels need
that). A test that computed its expected value after the call, from an array it had passed,
would let the learner choose it: here decode ignores the scale (a bug) and zeroes the query in
place, so that the oracle's softmax is uniform for every scale, like the one it returns. An
input a function must only read is checked unchanged (tests/labs/common.py, reading_only), so
every decode fails, as a decode that raises does (the honest twin)."""
_decode = paged_attention_decode


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale):
    query[...] = 0
    return _decode(query, key_cache, value_cache, block_tables, seq_lens, 1.0)
