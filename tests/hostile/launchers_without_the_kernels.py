# base: stub
# lab: lab-04
# tests: test_cache_write_scatters_rows, test_decode_one_sequence, test_decode_masks_past_seq_len
"""The kernels are the lab; the launchers around them are given. Empty kernels, and launchers
rewritten to compute the cache write and the decode in plain torch (a red-team helper scored
29/29 this way while the launchers of the learner's file were what the tests called): the
course's own launchers run the learner's kernels, so this scores what empty kernels earn."""
@triton.jit
def _reshape_and_cache_kernel(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr, stride_key_tok, stride_key_head, stride_value_tok, stride_value_head, stride_kc_blk, stride_kc_tok, stride_kc_head, stride_vc_blk, stride_vc_tok, stride_vc_head, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    pass  # no kernel: the launchers below never call one


@triton.jit
def _paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, lse_ptr, qk_scale, num_splits, stride_q_seq, stride_q_head, stride_k_blk, stride_k_tok, stride_k_head, stride_v_blk, stride_v_tok, stride_v_head, stride_bt_seq, stride_o_seq, stride_o_head, stride_o_split, stride_lse_seq, stride_lse_head, QUERIES_PER_KV: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, WRITE_FINAL: tl.constexpr, IEEE_DOT: tl.constexpr):
    pass  # no kernel: the launchers below never call one


@triton.jit
def _merge_splits_kernel(partial_ptr, lse_ptr, out_ptr, num_splits, stride_p_seq, stride_p_head, stride_p_split, stride_lse_seq, stride_lse_head, stride_o_seq, stride_o_head, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    pass  # no kernel: the launchers below never call one


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    slots = slot_mapping.long()
    keep = slots >= 0
    s = slots[keep]
    block_size = key_cache.shape[1]
    key_cache[s // block_size, s % block_size] = key[keep].to(key_cache.dtype)
    value_cache[s // block_size, s % block_size] = value[keep].to(value_cache.dtype)


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, *,
                           out=None, **_):
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    result = torch.empty_like(query)
    for i in range(query.shape[0]):
        n = int(seq_lens[i])
        pos = torch.arange(n, device=key_cache.device)
        blocks = block_tables[i].long()[pos // block_size]
        k = key_cache[blocks, pos % block_size].double().repeat_interleave(group, dim=1)
        v = value_cache[blocks, pos % block_size].double().repeat_interleave(group, dim=1)
        q = query[i].to(key_cache.dtype).double()
        weights = torch.softmax(torch.einsum("hd,thd->ht", q, k) * scale, dim=-1)
        result[i] = torch.einsum("ht,thd->hd", weights, v).to(query.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
