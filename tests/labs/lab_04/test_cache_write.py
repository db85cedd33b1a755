"""lab-04, part 1: the cache-write kernel (``_reshape_and_cache_kernel``), through the given
launcher ``reshape_and_cache``."""

from __future__ import annotations

import numpy as np

from grading.remote import LearnerError, writes
from grading.suite import graded
from tests.labs.lab_04.support import WRITE, device, load, side, torch_module

DOC = "phases/04-attention-kernels/README.md"


def write(
    slots: list[int],
    *,
    dtype: str = "float32",
    num_blocks: int = 6,
    block_size: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
):
    """Run the learner's write into a garbage-filled cache with a guard block on each side.

    Returns (buffer_k, buffer_v, expected_k, expected_v) as float64 numpy arrays; the cache is
    ``buffer[1:-1]``, sliced in the learner process from the whole buffer, which comes back.
    """
    torch = torch_module()
    load(*WRITE)
    dev, dt = device(), getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks + 2, block_size, kv_heads, head_dim)
    buf_k = torch.randn(shape, generator=gen).to(device=dev, dtype=dt)
    buf_v = torch.randn(shape, generator=gen).to(device=dev, dtype=dt)
    key = torch.randn((len(slots), kv_heads, head_dim), generator=gen).to(device=dev, dtype=dt)
    value = torch.randn((len(slots), kv_heads, head_dim), generator=gen).to(device=dev, dtype=dt)
    want_k, want_v = buf_k.double().cpu().numpy(), buf_v.double().cpu().numpy()
    for i, slot in enumerate(slots):
        if slot >= 0:
            want_k[1 + slot // block_size, slot % block_size] = key[i].double().cpu().numpy()
            want_v[1 + slot // block_size, slot % block_size] = value[i].double().cpu().numpy()
    side().write_guarded(
        key,
        value,
        writes(buf_k),
        writes(buf_v),
        torch.tensor(slots, dtype=torch.int64, device=dev),
    )
    return buf_k.double().cpu().numpy(), buf_v.double().cpu().numpy(), want_k, want_v


def check(got: np.ndarray, want: np.ndarray, name: str, rule: str) -> None:
    rows = np.argwhere(np.any(got != want, axis=(2, 3)))
    if not rows.size:
        return
    block, offset = rows[0].tolist()
    size = got.shape[1]
    if block == 0 or block == got.shape[0] - 1:
        where = f"OUTSIDE the cache ({'before' if block == 0 else 'after'} it)"
    else:
        where = f"at {name}[{block - 1}, {offset}] (slot {(block - 1) * size + offset})"
    raise AssertionError(f"{rule}: {len(rows)} rows differ, the first {where}")


@graded(
    3,
    "token i's K and V rows go to block slot // block_size, row slot % block_size of "
    "key_cache and value_cache; nothing else changes",
    f"{DOC}#the-cache-write-kernel",
)
def test_cache_write_scatters_rows():
    """Seven tokens to scattered slots of a 6-block cache (blocks of 4)."""
    slots = [3, 17, 0, 23, 9, 12, 6]
    got_k, got_v, want_k, want_v = write(slots)
    check(got_k, want_k, "key_cache", f"writing slots {slots}")
    check(got_v, want_v, "value_cache", f"writing slots {slots}")


@graded(
    1,
    "the cache write loads only the token's own NUM_KV_HEADS * HEAD_DIM elements: the K and "
    "V loads are masked (idx < NUM_KV_HEADS * HEAD_DIM), as the stores are",
    f"{DOC}#the-cache-write-kernel",
)
def test_cache_write_reads_nothing_past_its_inputs():
    """Three KV heads of 16 values (48: one tile of 64): a load past the last token's row reads
    memory outside every tensor the kernel was given, which the learner process's check of
    every load in the interpreter refuses (``learner_side._bound_the_loads``)."""
    slots = [9, 2, 14]
    try:
        got_k, got_v, want_k, want_v = write(slots, kv_heads=3)
    except LearnerError as exc:
        raise AssertionError(
            f"writing slots {slots}, 3 KV heads of 16: {exc}. Mask the K and V loads as the "
            "stores are (idx < NUM_KV_HEADS * HEAD_DIM)"
        ) from None
    check(got_k, want_k, "key_cache", f"writing slots {slots} (3 KV heads)")
    check(got_v, want_v, "value_cache", f"writing slots {slots} (3 KV heads)")


@graded(
    2,
    "a slot < 0 is padding: the program returns before storing anything (in Triton "
    "-1 // 4 == 0 and -1 % 4 == -1: a store would land just BEFORE the cache)",
    f"{DOC}#padding-slots",
)
def test_padding_slots_write_nothing():
    """Slots -1 and -5 among real ones: only the real slots change."""
    slots = [-1, 5, -1, 14, -5]
    got_k, got_v, want_k, want_v = write(slots, seed=1)
    check(got_k, want_k, "key_cache", f"writing slots {slots} (negative = padding)")
    check(got_v, want_v, "value_cache", f"writing slots {slots} (negative = padding)")


@graded(
    1,
    "the cache dtype is kept and strided inputs (K sliced out of a fused QKV projection, V "
    "head-major, caches sliced out of larger ones) are read and written through their strides",
    f"{DOC}#the-cache-write-kernel",
)
def test_cache_write_bf16_from_a_fused_projection():
    """bf16 keys as the first 16 columns of heads 4:6 of one [tokens, 8, 24] tensor, values
    head-major, the key cache the first 16 columns of the K half of a [blocks, 2, 4, 2, 24]
    cache, the value cache the first 16 columns of heads 2:4 of a [blocks, 4, 4, 20] cache: key,
    value and the two caches all have their own strides, none of them head_dim apart."""
    torch = torch_module()
    load(*WRITE)
    dev = device()
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn((5, 8, 24), generator=gen).to(device=dev, dtype=torch.bfloat16)
    value_src = torch.randn((2, 5, 64), generator=gen).to(device=dev, dtype=torch.bfloat16)
    key, value = qkv[:, 4:6, :16].clone(), value_src[:, :, :16].transpose(0, 1).clone()
    key_buffer = torch.zeros((5, 2, 4, 2, 24), dtype=torch.bfloat16, device=dev)  # K: [1:-1, 0]
    value_buffer = torch.zeros((5, 4, 4, 20), dtype=torch.bfloat16, device=dev)  # [1:-1, :, 2:]
    slots = [0, 5, -1, 11, 6]
    # The learner process slices key, value and the caches out of these tensors itself, so the
    # kernel reads and writes strided views, as it would behind a fused projection.
    side().write_strided(
        qkv,
        value_src,
        writes(key_buffer),
        writes(value_buffer),
        torch.tensor(slots, device=dev),
        2,
        16,
    )
    flat_k = key_buffer[1:-1, 0, :, :, :16].reshape(12, 2, 16)
    flat_v = value_buffer[1:-1, :, 2:, :16].reshape(12, 2, 16)
    layout = {
        "key": "the keys are the first 16 columns of heads 4:6 of a fused [5, 8, 24] "
        "projection (token stride 192, head stride 24: not head_dim), and the key cache is the "
        "first 16 columns of the K half [:, 0] of a "
        "[3, 2, 4, 2, 24] cache (head stride 24: not head_dim; token stride 48, block stride "
        "384: not block_size x the token stride)",
        "value": "the values are a head-major [2, 5, 64] tensor's first 16 columns seen as "
        "[5, 2, 16] (token stride 64, head stride 320), and the value cache is the first 16 "
        "columns of heads 2:4 of a [3, 4, 4, 20] cache (head stride 20, token stride 80: not "
        "the values' 64, block stride 320: not the key cache's strides)",
    }
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        for name, cache, rows in (("key", flat_k, key), ("value", flat_v, value)):
            if not torch.equal(cache[slot], rows[i]):
                raise AssertionError(
                    f"{name}_cache slot {slot} != {name} row {i}: {layout[name]}; read and "
                    f"write through the {name}'s own strides the launcher passes, and keep the "
                    "cache's bf16"
                )
    untouched = [s for s in range(12) if s not in slots]
    if bool(flat_k[untouched].abs().sum() != 0) or bool(flat_v[untouched].abs().sum() != 0):
        raise AssertionError(f"slots {untouched} were never written to but changed")
    if bool(key_buffer[1:-1, 0, :, :, 16:].abs().sum() != 0):
        raise AssertionError(
            "the key cache's heads are 24 elements apart but 16 wide, and the 8 columns after "
            "each head changed: address a head through stride_kc_head, not head_dim"
        )
    if bool(key_buffer[1:-1, 1].abs().sum() != 0):
        raise AssertionError(
            "the key cache is the K half [:, 0] of a [3, 2, 4, 2, 24] cache, but the V half "
            "beside it changed: a block starts stride_kc_blk elements after the previous one, "
            "not block_size x stride_kc_tok"
        )
    if bool(value_buffer[1:-1, :, 2:, 16:].abs().sum() != 0):
        raise AssertionError(
            "the value cache's heads are 20 elements apart but 16 wide, and the 4 columns "
            "after each head changed: address a head through stride_vc_head, not head_dim"
        )
    if bool(value_buffer[1:-1, :, :2].abs().sum() != 0):
        raise AssertionError(
            "the value cache is heads 2:4 of a wider cache, but heads 0:2 beside it changed: "
            "address the value cache through its own strides (stride_vc_*), not the key cache's"
        )
    if bool(key_buffer[[0, -1]].abs().sum() != 0) or bool(value_buffer[[0, -1]].abs().sum() != 0):
        raise AssertionError("a store landed OUTSIDE the cache (in a guard block beside it)")


@graded(
    1,
    "the second grid axis tiles a token's num_kv_heads * head_dim elements: program "
    "(token, t) copies elements t * TILE ..",
    f"{DOC}#the-cache-write-kernel",
)
def test_cache_write_rows_wider_than_a_tile():
    """5 KV heads of 1024: 5120 elements per token, more than one tile of 4096."""
    slots = [1, -1, 2]
    got_k, got_v, want_k, want_v = write(
        slots, num_blocks=2, block_size=2, kv_heads=5, head_dim=1024, seed=3
    )
    check(got_k, want_k, "key_cache", "rows of 5 x 1024 elements")
    check(got_v, want_v, "value_cache", "rows of 5 x 1024 elements")
