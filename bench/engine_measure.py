"""Measuring helpers the systems share: percentiles, byte counts, the copy rate, peak memory.

Kept apart from the systems so that each figure (a TTFT percentile, the weights' bytes, the
bandwidth floor's copy rate) is computed one way for every system it is compared across.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None for no values."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def latency_summary(ttft: list[float], tpot: list[float]) -> dict[str, float | None]:
    return {
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50),
        "tpot_p99": pct(tpot, 99),
    }


def torch_setup(device: str, threads: int | None = None) -> Any:
    """Import torch with ``--threads`` intra-op threads on CPU.

    The default is 1: on a shared or loaded machine, OpenMP workers spinning for the cores
    slow every small op by one or two orders of magnitude (measured here: 8 ms a decoding step
    of a tiny model on 1 thread, 1.1 s on 2 with the machine's load at 10).
    """
    import torch

    if device == "cpu" and threads:
        torch.set_num_threads(threads)
    return torch


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def model_dtype(device: str, dtype: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, dtype)


def weight_bytes(model: Any) -> int:
    """Bytes of the distinct parameter tensors (a tied head counts once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    from mini_vllm.worker import kv_sizing

    layers, kv_heads, head_dim = kv_sizing.kv_cache_dims(config)
    return kv_sizing.bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)


def sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_rate(torch: Any, device: str, nbytes: int = 1 << 30) -> float:
    """DRAM bytes per second of a device-to-device copy (bytes read + bytes written)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(torch, device)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(torch, device)
        times.append(time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def peak_memory_beyond(torch: Any, device: str, baseline: int) -> int | None:
    if device != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated() - baseline)
