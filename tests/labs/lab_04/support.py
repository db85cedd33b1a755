"""Helpers of the lab-04 suite: loading the learner's kernels, test data and the ground truth.

The ground truth is computed here in float64 numpy (or float32 torch for the GPU-sized tests)
from keys the test laid out itself; it never calls the learner's file. Caches are allocated
with a guard block on each side (the cache is ``buffer[1:-1]``): a kernel that writes or reads
one row outside the cache touches the guards, which the tests check, instead of memory that
belongs to nothing (the interpreter does not bounds-check pointers).
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from grading.suite import load_impl

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


def _not_started_message(kernel: Any, name: str) -> str | None:
    """The message of a ``raise NotImplementedError(...)`` in the kernel's body, if any.

    A stub kernel cannot even be compiled for a GPU (Triton has no ``raise``), and the
    interpreter wraps the exception in its own error, so the suite reads the kernel's source
    instead of running it: a kernel that still raises ``NotImplementedError`` is NOT STARTED.
    """
    fn = getattr(kernel, "fn", kernel)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            args = node.exc.args if isinstance(node.exc, ast.Call) else []
            parts = [a.value for a in args if isinstance(a, ast.Constant)]
            return " ".join(str(p) for p in parts) or f"lab-04: {name} is not written yet"
    return None


def load(*kernels: str) -> ModuleType:
    """The learner's module, after checking that the kernels a test needs are written."""
    mod = load_impl(MODULE)
    for name in kernels:
        kernel = getattr(mod, name, None)
        if kernel is None:
            raise AssertionError(
                f"{MODULE}.py has no {name}: keep the kernels' names, the launchers call them")
        message = _not_started_message(kernel, name)
        if message is not None:
            raise NotImplementedError(message)
    return mod


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


def make_case(seed: int, seq_lens: list[int], block_size: int, num_heads: int,
              num_kv_heads: int, head_dim: int = 16, pad_value: int = -1,
              garbage: float = 3.0) -> Case:
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
        tables[i, :u] = perm[start:start + u]
        start += u
        for p in range(n):
            block, offset = tables[i, p // block_size] + 1, p % block_size  # +1: the guard
            buffer_k[block, offset] = rng.standard_normal((num_kv_heads, head_dim))
            buffer_v[block, offset] = rng.standard_normal((num_kv_heads, head_dim))
    query = rng.standard_normal((len(seq_lens), num_heads, head_dim))
    return Case(query, buffer_k, buffer_v, tables, np.array(seq_lens, dtype=np.int32))


def oracle_decode(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                  tables: np.ndarray, seq_lens: np.ndarray, scale: float) -> np.ndarray:
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


TOLERANCE = {"float32": (2e-5, 0.0), "float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2)}


def run_decode(mod: ModuleType, case: Case, dtype: str = "float32", scale: float = 0.25,
               **kwargs: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """The learner's decode on ``dtype`` copies, the oracle on the same rounded values.

    Returns (got, want, tolerance).
    """
    torch = torch_module()
    dt = getattr(torch, dtype)
    dev = device()
    buf_k = torch.from_numpy(case.buffer_k).to(device=dev, dtype=dt)
    buf_v = torch.from_numpy(case.buffer_v).to(device=dev, dtype=dt)
    q = torch.from_numpy(case.query).to(device=dev, dtype=dt)
    guards = (buf_k[[0, -1]].clone(), buf_v[[0, -1]].clone())
    got = mod.paged_attention_decode(
        q, buf_k[1:-1], buf_v[1:-1], torch.from_numpy(case.tables).to(dev),
        torch.from_numpy(case.seq_lens).to(dev), scale, **kwargs)
    if tuple(got.shape) != tuple(q.shape):
        raise AssertionError(f"output shape {tuple(got.shape)}, expected {tuple(q.shape)}")
    want = oracle_decode(q.double().cpu().numpy(), buf_k[1:-1].double().cpu().numpy(),
                         buf_v[1:-1].double().cpu().numpy(), case.tables, case.seq_lens, scale)
    if not (torch.equal(buf_k[[0, -1]], guards[0]) and torch.equal(buf_v[[0, -1]], guards[1])):
        raise AssertionError("decode wrote to memory outside the KV cache (it must only read it)")
    atol, rtol = TOLERANCE[dtype]
    return got.double().cpu().numpy(), want, atol + rtol * float(np.abs(want).max())


def assert_close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0].tolist()
        raise AssertionError(
            f"{what}: the output holds inf/nan, first at [seq, head, dim] = {bad} (exp2 of an "
            "unshifted score overflowed? a 0 / 0 in an empty split?)")
    err = np.abs(got - want)
    worst = float(err.max())
    if worst > tol:
        seq, head, dim = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(
            f"{what}: max |got - expected| = {worst:.3g} > {tol:.2g}, at sequence {seq}, query "
            f"head {head}, dim {dim} (got {got[seq, head, dim]:.5g}, expected "
            f"{want[seq, head, dim]:.5g})")
