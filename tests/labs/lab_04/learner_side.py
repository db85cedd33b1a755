"""lab-04's helpers in the learner process: they build views, run the kernels, and never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. Tensors cross
between the processes by value (as contiguous copies), so what a kernel must see as a *view*
(a cache that is ``buffer[1:-1]`` of a buffer with a guard block on each side, keys sliced out
of a fused projection with their own strides) is sliced here, next to the learner's code, from
the whole buffer the judge sent. The whole buffer is then copied back to the judge, guards
included, and the judge checks it.

:func:`gpu_case` builds the GPU-sized tests' data from a seed on the device: the judge builds
the same tensors with the same function (the judge imports this file as
``tests.labs.lab_04.learner_side``), so hundreds of megabytes of cache never cross.

It imports torch, and the learner's ``triton_paged_attention`` only when a helper runs it.

The kernels are the lab; the launchers around them are given. So every helper runs the
learner's three kernels through the course's own launchers (a private copy of the staged
``mini_vllm.attention.triton_paged_attention``, whose kernels are stubs until the learner's are
put in): launchers edited in the learner's file, to compute the attention without the kernels
or otherwise, are never called.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

#: The graded kernels: the launchers' module-level names for them.
KERNELS = ("_reshape_and_cache_kernel", "_paged_decode_kernel", "_merge_splits_kernel")
#: One copy of the launchers, for the learner module of the moment.
_copies: dict[int, Any] = {}


def _course_launchers() -> Any:
    """The given launchers, calling the kernels of the learner's file."""
    import triton_paged_attention as learner

    module = _copies.get(id(learner))
    if module is None:
        if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"):
            _bound_the_loads()
        spec = importlib.util.find_spec("mini_vllm.attention.triton_paged_attention")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # a copy of its own: no other module shares it
        for name in KERNELS:
            kernel, stub = getattr(learner, name), getattr(module, name)
            if type(kernel) is not type(stub):  # what @triton.jit makes, here
                raise TypeError(
                    f"{name} must be a @triton.jit kernel, as in the stub; got "
                    f"{type(kernel).__module__}.{type(kernel).__qualname__}"
                )
            setattr(module, name, kernel)
        _copies.clear()
        _copies[id(learner)] = module
    return module


def _bound_the_loads() -> None:
    """In the interpreter, check every load a kernel makes against the tensors its launch was
    given: a load of an element outside all of them (past the block tables, past the query's
    last group, past the last token's keys) raises ``IndexError`` instead of reading whatever
    memory lies there, which changes no number and so would pass (the interpreter checks no
    pointer, and a GPU does not trap a read just past an allocation). Every call on the CPU is
    checked alike, so a kernel cannot tell a checked call from another. Installed once, for the
    life of this process, by :func:`_course_launchers`."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    if getattr(builder, "_course_bounded", False):
        return
    run, load = executor.__call__, builder.create_masked_load
    extents: list[tuple[int, int]] = []

    def extent(tensor: Any) -> tuple[int, int] | None:
        """The bytes ``[lo, hi)`` that the view's elements span."""
        size = tensor.element_size()
        lo = hi = tensor.data_ptr()
        for n, stride in zip(tensor.shape, tensor.stride()):
            if n == 0:
                return None
            if stride >= 0:
                hi += (n - 1) * stride * size
            else:
                lo += (n - 1) * stride * size
        return lo, hi + size

    def bounded_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        outer = extents[:]
        extents[:] = [e for e in map(extent, tensors) if e is not None]
        try:
            return run(self, *args, **kwargs)
        finally:
            extents[:] = outer

    def bounded_load(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        lanes = np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)
        addresses = ptrs.data[lanes].astype(np.uint64)
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        inside = np.zeros(addresses.shape, dtype=bool)
        for lo, hi in extents:
            inside |= (addresses >= lo) & (addresses + size <= hi)
        if not inside.all():
            raise IndexError(
                f"a load read {int((~inside).sum())} elements outside every tensor the kernel "
                "was given: mask each load to what it may read (the per-token table load with "
                "t < seq_len, the query rows with offs_g < QUERIES_PER_KV, the cache write's K "
                "and V with idx < NUM_KV_HEADS * HEAD_DIM)"
            )
        return load(self, ptrs, mask, other, *rest)

    executor.__call__ = bounded_run
    builder.create_masked_load = bounded_load
    builder._course_bounded = True


# -- the cache write -----------------------------------------------------------------------------
def write_guarded(key: Any, value: Any, buf_k: Any, buf_v: Any, slots: Any) -> None:
    """``reshape_and_cache`` into ``buf_k[1:-1]`` and ``buf_v[1:-1]`` (views of the buffers)."""
    _course_launchers().reshape_and_cache(key, value, buf_k[1:-1], buf_v[1:-1], slots)


def write(key: Any, value: Any, key_cache: Any, value_cache: Any, slots: Any) -> None:
    """``reshape_and_cache`` as the engine calls it (the caches come back by value)."""
    _course_launchers().reshape_and_cache(key, value, key_cache, value_cache, slots)


def write_strided(
    qkv: Any,
    value_src: Any,
    key_buffer: Any,
    value_buffer: Any,
    slots: Any,
    kv_heads: int,
    dim: int,
) -> None:
    """Keys as the first ``dim`` columns of heads ``-2 * kv_heads : -kv_heads`` of a fused
    ``[tokens, heads, >= dim]`` projection, values as a head-major ``[kv_heads, tokens, >= dim]``
    tensor seen as ``[tokens, kv_heads, dim]``, written into the first ``dim`` columns of
    ``key_buffer[1:-1, 0]`` (the K half of a ``[blocks, 2, block_size, kv_heads, >= dim]``
    cache, its heads wider than ``dim`` in memory) and of heads ``kv_heads:`` of
    ``value_buffer[1:-1]`` (a cache twice as many heads wide, its heads wider than ``dim`` too):
    every tensor has its own strides."""
    key = qkv[:, -2 * kv_heads : -kv_heads, :dim]
    value = value_src[:, :, :dim].transpose(0, 1)
    _course_launchers().reshape_and_cache(
        key,
        value,
        key_buffer[1:-1, 0, :, :, :dim],
        value_buffer[1:-1, :, kv_heads:, :dim],
        slots,
    )


# -- the decode ----------------------------------------------------------------------------------
def decode_guarded(
    query: Any,
    buf_k: Any,
    buf_v: Any,
    tables: Any,
    seq_lens: Any,
    scale: float,
    options: dict[str, Any],
    buf_out: Any,
    block_size: int | None = None,
    fused_query: bool = False,
    head_dim: int | None = None,
) -> Any:
    """``paged_attention_decode`` over the caches ``buf_k[1:-1]`` and ``buf_v[1:-1]`` (their
    first ``block_size`` rows of each block and ``head_dim`` columns, ``buf_k``'s width when not
    given: buffers with more rows per block, or wider rows, give the caches strides of their
    own), into
    ``out=buf_out[1 : 1 + num_seqs, :, :head_dim]`` (the rows around it, and the columns past
    ``head_dim`` of a wider ``buf_out``, are guards). With ``fused_query`` the
    query is ``query[:, 1:-1, :head_dim]``, a slice of a wider tensor with strides of its own
    (as the engine's query is a view of its fused QKV projection)."""
    dim = head_dim or buf_k.shape[-1]
    if fused_query:
        query = query[:, 1:-1, :dim]
    out = buf_out[1 : 1 + query.shape[0], :, :dim]
    key_cache = buf_k[1:-1, :block_size, :, :dim]
    value_cache = buf_v[1:-1, :block_size, :, :dim]
    return _course_launchers().paged_attention_decode(
        query, key_cache, value_cache, tables, seq_lens, scale, out=out, **options
    )


def decode_plain(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    tables: Any,
    seq_lens: Any,
    scale: float,
    options: dict[str, Any],
) -> Any:
    """``paged_attention_decode`` as the engine calls it: no ``out=``, the launcher allocates."""
    return _course_launchers().paged_attention_decode(
        query, key_cache, value_cache, tables, seq_lens, scale, **options
    )


def write_then_decode(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    table: Any,
    block_size: int,
    query: Any,
    scale: float,
    num_splits: int,
) -> Any:
    """The slots of tokens 0 .. n-1 from ``table`` (the given ``compute_slot_mapping``), the
    learner's write of ``key`` and ``value`` there, then the learner's decode of ``query``."""
    import torch

    mod = _course_launchers()
    n = key.shape[0]
    slots = mod.compute_slot_mapping(table, torch.arange(n), block_size)
    mod.reshape_and_cache(key, value, key_cache, value_cache, slots.to(key_cache.device))
    return mod.paged_attention_decode(
        query,
        key_cache,
        value_cache,
        table[None].to(key_cache.device),
        torch.tensor([n], device=key_cache.device),
        scale,
        num_splits=num_splits,
    )


def write_then_decode_far(
    key: Any, value: Any, query: Any, scale: float, num_splits: int, block_size: int
) -> Any:
    """:func:`write_then_decode` in float16 caches whose addresses pass ``2**31`` elements, the
    sequence in their last blocks, its table int32 (as the engine's): an address built in int32
    (a block id times a block stride) wraps there. The K and V caches are the two halves of one
    buffer of 4 GiB, allocated here and never sent (only the pages of the blocks used are touched).
    Returns None if this process cannot reserve that much address space."""
    import torch

    n, kv_heads, head_dim = key.shape
    num_blocks = 2**31 // (2 * block_size * kv_heads * head_dim) + 4
    try:
        buf = torch.empty(
            (num_blocks, 2, block_size, kv_heads, head_dim), dtype=torch.float16, device=key.device
        )
    except (RuntimeError, MemoryError):
        return None
    used = -(-n // block_size)
    table = torch.arange(num_blocks - used, num_blocks, dtype=torch.int32).flip(0)
    return write_then_decode(
        key.half(), value.half(), buf[:, 0], buf[:, 1], table, block_size, query, scale, num_splits
    )


# -- GPU-sized cases, built from a seed on both sides ----------------------------------------------
def gpu_case(
    seed: int,
    lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 128,
) -> tuple[Any, Any, Any, Any, Any]:
    """bf16 ``(query, key_cache, value_cache, tables, seq_lens)`` on the GPU, from ``seed``.

    The same call gives the same tensors in any process on the same device (CUDA's generator is
    counter-based); tables are a permutation of the pool drawn on the CPU.
    """
    import torch

    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + 8
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = torch.zeros((len(lens), max(used)), dtype=torch.int32)
    start = 0
    for i, u in enumerate(used):
        tables[i, :u] = perm[start : start + u]
        start += u
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    value_cache = torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)
    query = torch.randn((len(lens), num_heads, head_dim), generator=gen, device="cuda")
    return (
        query.to(torch.bfloat16),
        key_cache,
        value_cache,
        tables.to("cuda"),
        torch.tensor(lens, device="cuda"),
    )


def gpu_decode(
    seed: int, lens: list[int], block_size: int, num_heads: int, num_kv_heads: int, scale: float
) -> Any:
    """The learner's decode of :func:`gpu_case` ``(seed, ...)`` with the default split count."""
    import torch

    query, key_cache, value_cache, tables, seq_lens = gpu_case(
        seed, lens, block_size, num_heads, num_kv_heads
    )
    out = _course_launchers().paged_attention_decode(
        query, key_cache, value_cache, tables, seq_lens, scale
    )
    torch.cuda.synchronize()
    return out
