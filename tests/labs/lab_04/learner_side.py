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
    for name in KERNELS:
        # Checked at every call, on a GPU too (where nothing of the learner's runs during the
        # call after this): a kernel object that runs Python of the learner's around its
        # launch is refused at each of its launches (tests/hostile/: lab_04_sort_the_splits_
        # in_a_pre_run_hook.py, lab_04_merge_in_torch_on_the_kernels_own_run.py).
        kernel = getattr(module, name)
        if isinstance(kernel, _Refused):
            continue
        why = _own_launch(kernel)
        if why:
            setattr(module, name, _Refused(f"{name} {why}"))
    return module


def _own_launch(kernel: Any) -> str:
    """Why ``kernel`` (what ``@triton.jit`` made) would run Python of the learner's when
    launched, or "": pre-run hooks (Triton's ``add_pre_run_hook``: a hook that sorted a merge's
    splits made a wrong kernel merge right), or an attribute of the object that stands in for a
    method of its class (a ``run`` of its own, which ``kernel[grid]`` calls instead of Triton's:
    one that merged in torch). Triton's own class patched is not seen (docs/grader.md)."""
    if getattr(kernel, "pre_run_hooks", None):
        return "has pre-run hooks (add_pre_run_hook)"
    for key in vars(kernel):
        if not key.startswith("__") and callable(getattr(type(kernel), key, None)):
            return f"has a {key} of its own, in place of Triton's"
    return ""


class _Refused:
    """A kernel whose launches are refused, and why."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getitem__(self, grid: Any) -> Any:
        raise TypeError(f"{self.why}: a launch must run the kernel and nothing else")


def _bound_the_loads() -> None:
    """In the interpreter, check every load a kernel makes against the tensors its launch was
    given: a load of an element outside all of them (past the block tables, past the query's
    last group, past the last token's keys) raises ``IndexError`` instead of reading whatever
    memory lies there, which changes no number and so would pass (the interpreter checks no
    pointer, and a GPU does not trap a read just past an allocation). Every call on the CPU is
    checked alike, so a kernel cannot tell a checked call from another. An atomic reads the
    memory it changes and returns it, so ``tl.atomic_add(ptrs, 0)`` is a load too: the atomics
    (``atomic_rmw``, ``atomic_cas``) are checked like ``tl.load``, and every other way the
    interpreter reads memory (unmasked loads, atomic loads, tensor descriptors) goes through
    ``create_masked_load``. Installed once, for the life of this process, by
    :func:`_course_launchers`."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    if getattr(builder, "_course_bounded", False):
        return
    run, load = executor.__call__, builder.create_masked_load
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas
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
        if self.pre_run_hooks:
            raise TypeError(
                "a kernel launched with pre-run hooks (add_pre_run_hook): the launch must run "
                "the kernel and nothing else"
            )
        _only_triton(self.fn, set())
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        outer = extents[:]
        extents[:] = [e for e in map(extent, tensors) if e is not None]
        try:
            return run(self, *args, **kwargs)
        finally:
            extents[:] = outer

    def check(ptrs: Any, mask: Any) -> None:
        """Refuse the read if a lane that ``mask`` (an array) lets through lies outside every
        extent."""
        lanes = np.broadcast_to(mask, ptrs.data.shape).astype(bool)
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

    def bounded_load(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        check(ptrs, mask.data)
        return load(self, ptrs, mask, other, *rest)

    def bounded_rmw(self: Any, op: Any, ptrs: Any, val: Any, mask: Any, *rest: Any) -> Any:
        check(ptrs, mask.data)
        return rmw(self, op, ptrs, val, mask, *rest)

    def bounded_cas(self: Any, ptrs: Any, *rest: Any) -> Any:
        check(ptrs, np.True_)  # no mask: every lane reads
        return cas(self, ptrs, *rest)

    executor.__call__ = bounded_run
    builder.create_masked_load = bounded_load
    builder.create_atomic_rmw, builder.create_atomic_cas = bounded_rmw, bounded_cas
    builder._course_bounded = True


#: The builtins a kernel may name: those Triton's compiler knows.
_KERNEL_BUILTINS = frozenset(
    ("range", "float", "int", "bool", "min", "max", "len", "print", "abs", "isinstance")
)


def _triton_names() -> frozenset[str]:
    """The public names of ``triton.language`` and its submodules whose values are Triton's
    own (a function, a class, a dtype, a submodule of it), and the public attributes of its
    tensor and type classes: every attribute a kernel may read. A name those modules import
    from elsewhere (``builtins``, ``functools.partial``) is not among them."""
    import sys

    import triton.language as tl
    from triton.runtime.jit import KernelInterface

    def triton_own(value: Any) -> bool:
        if isinstance(value, (tl.dtype, tl.constexpr, int, float, bool, str, KernelInterface)):
            return True
        name = value.__name__ if isinstance(value, type(tl)) else getattr(value, "__module__", "")
        return isinstance(name, str) and name.startswith("triton.language")

    names = set()
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("triton.language") and module is not None:
            names.update(
                n for n, v in vars(module).items() if not n.startswith("_") and triton_own(v)
            )
    for kind in (tl.tensor, tl.dtype, tl.pointer_type, tl.block_type, tl.constexpr):
        names.update(n for n in dir(kind) if not n.startswith("_"))
    block = tl.block_type(tl.int32, [2])
    for value in (
        tl.int32,
        tl.pointer_type(tl.int32),
        block,
        tl.tensor(None, block),
        tl.constexpr(1),
    ):
        names.update(n for n in vars(value) if not n.startswith("_"))  # set by __init__
    # What the interpreter's rewrite of a kernel calls: interpreter_semantic.to_tensor around
    # each assignment, _InterpreterComparison(...).get_result() for a chained comparison.
    names.update(("to_tensor", "get_result"))
    return frozenset(names - {"handle"})


_ATTRIBUTES: list[frozenset[str]] = []
#: Each kernel's code (the interpreter's rewrite) scanned once: the global names it loads.
_SCANS: dict[Any, tuple[str, ...]] = {}


def _scan(code: Any, where: str) -> tuple[str, ...]:
    """The global names ``code`` (with the code nested in it) loads; refuses an attribute or a
    keyword that is not Triton's, an import, a global written and a closure."""
    import dis

    names = _SCANS.get(code)
    if names is not None:
        return names
    if not _ATTRIBUTES:
        _ATTRIBUTES.append(_triton_names())
    attributes, found, codes = _ATTRIBUTES[0], set(), [code]
    while codes:
        inner = codes.pop()
        if inner.co_freevars or inner.co_cellvars:
            raise TypeError(f"{where} uses a closure: a kernel may use only Triton")
        codes.extend(c for c in inner.co_consts if isinstance(c, type(code)))
        for ins in dis.get_instructions(inner):
            op = ins.opname
            if op in ("IMPORT_NAME", "IMPORT_FROM", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"):
                raise TypeError(f"{where} has {op} {ins.argval!r}: a kernel may use only Triton")
            if op in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"):
                if ins.argval not in attributes:
                    raise TypeError(
                        f"{where} reads .{ins.argval}, which is not Triton's: a kernel may use "
                        "only Triton (tl.*), other @triton.jit functions, its arguments and "
                        "constants"
                    )
            elif op == "KW_NAMES":
                for name in inner.co_consts[ins.arg]:
                    if name.startswith("_"):
                        raise TypeError(f"{where} passes the keyword {name}: Triton's own")
            elif op == "LOAD_GLOBAL":
                found.add(ins.argval)
    _SCANS[code] = names = tuple(sorted(found))
    return names


def _only_triton(fn: Any, seen: set[int]) -> None:
    """Refuse a kernel (the function the interpreter runs) that names anything but Triton:
    in the interpreter a kernel's body is Python, and one that called a Python function of its
    file (reading raw addresses with ``ctypes``, say) read past its table without a load
    (tests/hostile/lab_04_read_the_table_in_python.py), as no compiler would let a kernel do.
    Read from the bytecode that runs (the interpreter's rewrite of the kernel), at every launch:
    a global must be ``triton.language`` (or a module of it), another ``@triton.jit`` function
    (checked the same way), a constant or a builtin Triton's compiler knows; an attribute or a
    keyword must be one of Triton's public names (:func:`_triton_names`: never ``handle``, nor
    a name with an underscore); no import, no global written, no closure, no default argument
    but a constant. The bytecode is scanned once; its globals are looked up at every launch."""
    import builtins

    import triton.language as tl
    from triton.runtime import interpreter

    def constant(value: Any) -> bool:
        if isinstance(value, tl.constexpr):
            value = value.value
        return value is None or isinstance(value, (int, float, str, tl.dtype))

    code = getattr(fn, "__code__", None)
    if code is None or id(code) in seen:
        return
    seen.add(id(code))
    where = f"the kernel {getattr(fn, '__name__', '?')}"
    defaults = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    if not all(map(constant, defaults)):
        raise TypeError(f"{where} has a default argument that is not a constant: only Triton")
    # What the interpreter's rewrite itself names (Triton 3.9's: older ones lack the second).
    rewrite = tuple(
        own
        for own in (
            getattr(interpreter, "interpreter_semantic", None),
            getattr(interpreter, "_InterpreterComparison", None),
        )
        if own is not None
    )
    missing = object()
    for name in _scan(code, where):
        value = fn.__globals__.get(name, missing)
        if value is missing and name in _KERNEL_BUILTINS:
            continue
        if value is missing:
            value = getattr(builtins, name, None)
        if any(value is own for own in rewrite):
            continue
        if isinstance(value, interpreter.InterpretedFunction):
            _only_triton(value.rewrite(), seen)
        elif isinstance(value, type(tl)):
            if not value.__name__.startswith("triton.language"):
                raise TypeError(
                    f"{where} names the module {name} ({value.__name__}): a kernel may use only "
                    "Triton"
                )
        elif not constant(value):
            raise TypeError(
                f"{where} names {name}, a {type(value).__name__}: a kernel may use only Triton "
                "(tl.*), other @triton.jit functions, its arguments and constants"
            )


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
    import gc

    import torch

    n, kv_heads, head_dim = key.shape
    num_blocks = 2**31 // (2 * block_size * kv_heads * head_dim) + 4
    gc.collect()  # the last call's buffer, if a reference cycle still holds it
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
