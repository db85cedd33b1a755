# base: stub
# lab: lab-04
# tests: test_cache_write_scatters_rows, test_decode_one_sequence, test_decode_masks_past_seq_len
"""lab-04 grades Triton kernels through their launchers, which the learner's file holds; the
engine's torch attention (``mini_vllm.attention.torch_paged_attention``) computes the same write
and decode, and lab-04's own module imports it (for ``compute_slot_mapping``). Launchers that
call it instead of the kernels: the lab lists those functions as twins of its tasks, staged
stubbed, so they raise as the stub does and the score is the stub's."""
from mini_vllm.attention import torch_paged_attention as _engine


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    _engine.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, out=None, **_):
    result = _engine.paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    if out is not None:
        out.copy_(result)
        return out
    return result


def _reshape_and_cache_kernel():
    pass


def _paged_decode_kernel():
    pass


def _merge_splits_kernel():
    pass
