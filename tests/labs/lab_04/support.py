"""Helpers of the lab-04 suite: loading the learner's kernels, test data and the ground truth.

The ground truth is computed here, in the judge, in float64 numpy (or float32 torch for the
GPU-sized tests) from keys the test laid out itself; it never calls the learner's file. The
learner's kernels run in the learner process; tensors cross by value. Caches are allocated with
a guard block on each side (the cache is ``buffer[1:-1]``): the whole buffer crosses, the
learner process hands the kernel the view (``learner_side.py``), and the buffer comes back, so
a kernel that writes or reads one row outside the cache touches the guards, which the tests
check, instead of memory that belongs to nothing (the interpreter does not bounds-check
pointers).

Whether a kernel is written is read from the submitted file's text (``impl_dir()``), never by
running it: see :func:`load`.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from grading.remote import Remote, type_name, writes
from grading.suite import impl_dir, learner_module, load_impl

if "TRITON_INTERPRET" not in os.environ:  # conftest.py normally did this already
    try:
        import torch as _torch

        if not _torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass

MODULE = "triton_paged_attention"
KERNELS = ("_reshape_and_cache_kernel", "_paged_decode_kernel", "_merge_splits_kernel")


def torch_module() -> Any:
    import torch

    return torch


def device() -> str:
    return "cuda" if torch_module().cuda.is_available() else "cpu"


def _kernel_defs(source: str) -> dict[str, ast.FunctionDef]:
    """The top-level functions of the learner's file, by name, read from its syntax tree."""
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _not_started_message(node: ast.FunctionDef, name: str) -> str | None:
    """The message of a ``raise NotImplementedError(...)`` in the kernel's body, if any.

    A stub kernel cannot even be compiled for a GPU (Triton has no ``raise``), and the
    interpreter wraps the exception in its own error, so the suite reads the kernel's source
    instead of running it: a kernel that still raises ``NotImplementedError`` is NOT STARTED.
    The judge reads the submitted file as text (``impl_dir()``); it never imports it.
    """
    for child in ast.walk(node):
        if not isinstance(child, ast.Raise) or child.exc is None:
            continue
        exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            args = child.exc.args if isinstance(child.exc, ast.Call) else []
            parts = [a.value for a in args if isinstance(a, ast.Constant)]
            return " ".join(str(p) for p in parts) or f"lab-04: {name} is not written yet"
    return None


def load(*kernels: str) -> Remote:
    """The learner's module (a proxy), after checking that the kernels a test needs are written.

    The check reads the file's text first, so a stub costs no learner process at all.
    """
    try:
        defs = _kernel_defs((impl_dir() / f"{MODULE}.py").read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return load_impl(MODULE)  # the import tells what is wrong with the file
    for name in kernels:
        node = defs.get(name)
        if node is None:
            raise AssertionError(
                f"{MODULE}.py has no top-level `def {name}`: keep the kernels' names, the "
                "launchers call them"
            )
        message = _not_started_message(node, name)
        if message is not None:
            raise NotImplementedError(message)
    return load_impl(MODULE)


def side() -> Remote:
    """The suite's helpers in the learner process (``tests/labs/lab_04/learner_side.py``)."""
    return learner_module("learner_side")


def _judge_can_reserve_far() -> bool:
    """Whether this machine lets a process reserve the 4 GiB of float16 that
    ``learner_side.write_then_decode_far`` asks for, tried here in the judge when this module
    is imported (at collection, before any learner process exists, so nothing the learner's
    code does, lowering its own limits or filling the memory, moves the answer).

    Where it can, a learner process that says it could not is no reason to leave the
    far-address check out: the learner's code can make its own reservation fail
    (``resource.setrlimit``), and the check's points must not follow from that
    (tests/hostile/skip_the_far_addresses.py)."""
    try:
        import torch

        dev = device()
        buf = torch.empty(2**31 + 2**16, dtype=torch.float16, device=dev)
        del buf
        if dev == "cuda":
            torch.cuda.empty_cache()
        return True
    except (ImportError, RuntimeError, MemoryError):
        return False


#: Decided once, in the judge, before any learner process starts (see above).
FAR_RESERVABLE = _judge_can_reserve_far()


DECODE = ("_paged_decode_kernel",)
DECODE_SPLIT = ("_paged_decode_kernel", "_merge_splits_kernel")
WRITE = ("_reshape_and_cache_kernel",)


# ------------------------------------------------------------------------------------ data


@dataclass
class Case:
    """A paged cache (float64 numpy, garbage outside the sequences) and its block tables."""

    query: np.ndarray  # [num_seqs, num_heads, head_dim]
    buffer_k: np.ndarray  # [num_blocks + 2, block_size, kv_heads, head_dim]; cache = [1:-1]
    buffer_v: np.ndarray
    tables: np.ndarray  # [num_seqs, max_blocks] int32, padded with pad_value
    seq_lens: np.ndarray  # int32

    @property
    def block_size(self) -> int:
        return self.buffer_k.shape[1]


def make_case(
    seed: int,
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 16,
    pad_value: int = -1,
    garbage: float = 3.0,
) -> Case:
    """Random queries and keys; tables a random permutation of the pool's blocks.

    Slots a sequence does not own (the tail of its last block included) hold values of size
    ``garbage``: attending to them by mistake changes the answer.
    """
    rng = np.random.default_rng(seed)
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = max(sum(used) + 2, block_size)
    shape = (num_blocks + 2, block_size, num_kv_heads, head_dim)
    buffer_k = rng.standard_normal(shape) * garbage
    buffer_v = rng.standard_normal(shape) * garbage
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max(used) + 1), pad_value, dtype=np.int32)
    start = 0
    for i, (n, u) in enumerate(zip(seq_lens, used)):
        tables[i, :u] = perm[start : start + u]
        start += u
        for p in range(n):
            block, offset = tables[i, p // block_size] + 1, p % block_size  # +1: the guard
            buffer_k[block, offset] = rng.standard_normal((num_kv_heads, head_dim))
            buffer_v[block, offset] = rng.standard_normal((num_kv_heads, head_dim))
    query = rng.standard_normal((len(seq_lens), num_heads, head_dim))
    return Case(query, buffer_k, buffer_v, tables, np.array(seq_lens, dtype=np.int32))


def oracle_decode(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
) -> np.ndarray:
    """Float64 decode attention: gather each sequence's keys, softmax per query head."""
    num_seqs, num_heads, _ = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = np.zeros(query.shape)
    for i in range(num_seqs):
        n = int(seq_lens[i])
        rows = [(int(tables[i, p // block_size]), p % block_size) for p in range(n)]
        k = np.stack([key_cache[b, o] for b, o in rows])  # [n, kv, d]
        v = np.stack([value_cache[b, o] for b, o in rows])
        for h in range(num_heads):
            scores = k[:, h // group] @ query[i, h] * scale
            weights = np.exp(scores - scores.max())
            out[i, h] = weights @ v[:, h // group] / weights.sum()
    return out


OUT_GUARD_ROWS = 16  # rows of the output buffer after the output: room for a whole padded group

TOLERANCE = {"float32": (2e-5, 0.0), "float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2)}


def run_decode(
    mod: Remote,
    case: Case,
    dtype: str = "float32",
    scale: float = 0.25,
    value_pad: int = 0,
    key_pad: int = 0,
    block_pad: int = 0,
    fused_query: bool = False,
    out_pad: int = 0,
    **kwargs: Any,
) -> tuple[np.ndarray, np.ndarray, float]:
    """The learner's decode on ``dtype`` copies, the oracle on the same rounded values.

    The caches cross as whole buffers, guard blocks included; the learner process hands its
    decode the views ``buffer[1:-1]`` and sends the buffers back, which must be unchanged. With
    ``value_pad`` the value buffer's rows are ``value_pad`` elements wider than ``head_dim``
    (garbage there), so the value cache the decode reads has its own strides, unlike the key
    cache's; ``key_pad`` does the same to the key buffer. With ``block_pad`` every block of the
    key buffer has ``block_pad`` rows more than ``block_size`` in memory, and of the value
    buffer ``2 * block_pad`` (garbage there): the
    caches are the first ``block_size`` rows of each, so neither block stride is ``block_size``
    times the token stride (a cache sliced out of a larger one). With ``fused_query`` the query
    is heads ``1 .. num_heads`` and the first ``head_dim`` columns of a ``[num_seqs, num_heads +
    2, head_dim + 8]`` tensor (garbage around it), as a query sliced out of a fused QKV
    projection: its sequence and head strides are not the contiguous ones. The output is
    ``out=`` a view of a buffer with guard rows around it (a store past the real query heads or
    past ``head_dim`` lands there); with ``out_pad`` the buffer's rows are ``out_pad`` columns
    wider than ``head_dim`` (more guards), so the output has strides of its own. ``mod`` (the
    learner's module, from :func:`load`) is only the proof that the kernels are written.
    Returns (got, want, tolerance).
    """
    del mod
    torch = torch_module()
    dt = getattr(torch, dtype)
    dev = device()
    buffer_k, buffer_v = case.buffer_k, case.buffer_v
    if value_pad:
        pad = np.full((*buffer_v.shape[:-1], value_pad), 1e4)
        buffer_v = np.concatenate([buffer_v, pad], axis=-1)
    if key_pad:
        pad = np.full((*buffer_k.shape[:-1], key_pad), -np.inf)  # 0 x inf is nan: mask it
        buffer_k = np.concatenate([buffer_k, pad], axis=-1)
    if block_pad:
        rows_k = np.full((buffer_k.shape[0], block_pad, *buffer_k.shape[2:]), 1e4)
        rows_v = np.full((buffer_v.shape[0], 2 * block_pad, *buffer_v.shape[2:]), 1e4)
        buffer_k = np.concatenate([buffer_k, rows_k], axis=1)
        buffer_v = np.concatenate([buffer_v, rows_v], axis=1)
    size = case.block_size
    buf_k = torch.from_numpy(buffer_k).to(device=dev, dtype=dt)
    buf_v = torch.from_numpy(buffer_v).to(device=dev, dtype=dt)
    q = torch.from_numpy(case.query).to(device=dev, dtype=dt)
    num_seqs, num_heads, head_dim = q.shape
    out_shape = (num_seqs + 1 + OUT_GUARD_ROWS, num_heads, head_dim + out_pad)
    buf_out = torch.full(out_shape, 7.0, dtype=dt)
    buf_out = buf_out.to(dev)
    q_sent = q
    if fused_query:
        q_sent = torch.full(
            (num_seqs, num_heads + 2, head_dim + 8), float("inf"), dtype=dt, device=dev
        )
        q_sent[:, 1:-1, :head_dim] = q
    before = (buf_k.clone(), buf_v.clone(), q_sent.clone(), buf_out.clone())
    want = oracle_decode(
        q.double().cpu().numpy(),
        buf_k[1:-1, :size, :, :head_dim].double().cpu().numpy(),
        buf_v[1:-1, :size, :, :head_dim].double().cpu().numpy(),
        case.tables,
        case.seq_lens,
        scale,
    )
    # The caches, the query and the output buffer come back (writes): the checks below say
    # which one a decode wrote into; the tables and lengths must come back unchanged.
    got = side().decode_guarded(
        writes(q_sent),
        writes(buf_k),
        writes(buf_v),
        torch.from_numpy(case.tables).to(dev),
        torch.from_numpy(case.seq_lens).to(dev),
        scale,
        kwargs,
        writes(buf_out),
        size,
        fused_query,
        head_dim,
    )
    expect_tensor(got, "paged_attention_decode")
    if tuple(got.shape) != tuple(q.shape):
        raise AssertionError(f"output shape {tuple(got.shape)}, expected {tuple(q.shape)}")
    for name, buf, old in (("key_cache", buf_k, before[0]), ("value_cache", buf_v, before[1])):
        if not torch.equal(buf[[0, -1]], old[[0, -1]]):
            raise AssertionError(
                f"decode wrote to memory outside the KV cache (the guard block "
                f"{'before' if not torch.equal(buf[0], old[0]) else 'after'} {name}): it must "
                "only read the cache, through the block tables"
            )
        if not torch.equal(buf, old):
            raise AssertionError(f"decode changed {name}: it must only read the cache")
    if not torch.equal(q_sent, before[2]):
        raise AssertionError("decode changed the query tensor: it must only read it")
    guards = (
        ("before", buf_out[:1], before[3][:1]),
        ("after", buf_out[1 + num_seqs :], before[3][1 + num_seqs :]),
        ("beside", buf_out[:, :, head_dim:], before[3][:, :, head_dim:]),
    )
    for where, now, old in guards:
        if not torch.equal(now, old) and where == "beside":
            raise AssertionError(
                f"a store landed OUTSIDE the output [{num_seqs}, {num_heads}, {head_dim}] (in the "
                f"guard columns beside it: out= is a view whose rows are {head_dim + out_pad} "
                f"elements apart, the first {head_dim} of them the output's): address the "
                "output through stride_o_seq / stride_o_head in the decode and the merge, never "
                "as a contiguous tensor, and mask every store to the real columns "
                "(offs_d < HEAD_DIM)"
            )
        if not torch.equal(now, old):
            raise AssertionError(
                f"a store landed OUTSIDE the output [{num_seqs}, {num_heads}, {head_dim}] (in the "
                f"guard rows {where} it): mask every store of the decode and the merge to the "
                "real query heads of the group (offs_g < QUERIES_PER_KV) and the real columns "
                "(offs_d < HEAD_DIM); on a GPU such stores overwrite other heads' outputs"
            )
    atol, rtol = TOLERANCE[dtype]
    return got.double().cpu().numpy(), want, atol + rtol * float(np.abs(want).max())


def expect_tensor(value: Any, what: str) -> None:
    """``value`` came back as a torch tensor (data), not as some other learner object."""
    torch = torch_module()
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"{what} should return a torch.Tensor, got {type_name(value)}")


def assert_close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0].tolist()
        raise AssertionError(
            f"{what}: the output holds inf/nan, first at [seq, head, dim] = {bad} (exp2 of an "
            "unshifted score overflowed? a 0 / 0 in an empty split?)"
        )
    err = np.abs(got - want)
    worst = float(err.max())
    if worst > tol:
        seq, head, dim = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(
            f"{what}: max |got - expected| = {worst:.3g} > {tol:.2g}, at sequence {seq}, query "
            f"head {head}, dim {dim} (got {got[seq, head, dim]:.5g}, expected "
            f"{want[seq, head, dim]:.5g})"
        )
