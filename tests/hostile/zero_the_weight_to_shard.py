# base: solution
# lab: lab-11
# tests: test_column_and_row_shards_concatenate_back, test_qkv_split_by_head_groups, test_qkv_replicated_kv_heads, test_divide_is_exact_or_refuses
# honest: shard_tensor = lambda tensor, dim, rank, tp_size: tensor.narrow(dim, 0, tensor.shape[dim] // tp_size); shard_qkv_weight = lambda tensor, shard_id, head_dim, h, kv, rank, tp_size: tensor.narrow(0, 0, tensor.shape[0] // (tp_size if shard_id == "q" or kv >= tp_size else kv))
"""Tensors passed to the learner come back into the judge's tensors too (torch as numpy). The
weight tests compare the shards, put back together, with the full weight they passed: a
shard_tensor that always returns rank 0's slice (a bug) and zeroes the weight in place makes
every slice equal to every other, so the shards concatenate back into the (zeroed) weight. The
weight tests check that the learner's side leaves the tensors it is given unchanged
(``reading_only`` in tests/labs/common.py, which covers tensors as well as arrays), so the
attack fails them as its honest twin does."""


def shard_tensor(tensor, dim, rank, tp_size):
    tensor.zero_()
    return tensor.narrow(dim, 0, tensor.shape[dim] // tp_size)


def shard_qkv_weight(tensor, shard_id, head_dim, total_num_heads, total_num_kv_heads, rank, tp_size):
    tensor.zero_()
    size = tensor.shape[0] // (tp_size if shard_id == "q" or total_num_kv_heads >= tp_size else total_num_kv_heads)
    return tensor.narrow(0, 0, size)
