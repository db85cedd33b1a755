# base: solution
# lab: lab-03
# tests: test_dtype_size, test_bytes_per_token_of_real_models, test_startup_log_line_of_llama3_8b, test_max_concurrency
# honest: _right_size = dtype_size; dtype_size = lambda dtype: 4 if str(dtype).removeprefix("torch.") == "bfloat16" else _right_size(dtype); _bpt = bytes_per_token; bytes_per_token = lambda num_layers, num_kv_heads, head_dim, dtype_bytes: _bpt(num_layers, num_kv_heads, head_dim, _right_size(dtype_bytes))
"""``dtype_size`` sizes bfloat16 at 4 bytes (the honest bug), while ``bytes_per_token`` sizes a
dtype given by name right. Two tests handed what ``dtype_size`` returned straight to
``bytes_per_token`` / ``bytes_per_block`` without reading it: a ``dtype_size`` that returns,
for bfloat16, an ``int`` subclass (a handle in the judge, never a number) which the learner's
``bytes_per_token`` reads back as "bfloat16" passed them with the bug in place (a red-team
helper: 7 points more than the honest bug). The judge now takes every size as a whole number
before it sends it on."""


class _Named(int):
    """4, wrong, but remembers the name it was asked for."""

    name = "bfloat16"


_right_size = dtype_size
_bpt = bytes_per_token


def dtype_size(dtype):
    if str(dtype).removeprefix("torch.") == "bfloat16":
        return _Named(4)
    return _right_size(dtype)


def bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes):
    if type(dtype_bytes) is _Named:
        dtype_bytes = dtype_bytes.name
    return _bpt(num_layers, num_kv_heads, head_dim, _right_size(dtype_bytes))
