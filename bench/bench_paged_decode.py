"""Decode attention through block tables on a GPU: our Triton kernel against its baselines.

Decode attention reads every cached K/V byte of the batch once and does two multiply-adds per byte
pair and query head, so it is bound by memory bandwidth. The question this benchmark answers is how
much of the GPU's bandwidth the paged kernel gets, side by side in one run:

* ``triton``: ``mini_vllm.attention.triton_paged_attention.paged_attention_decode`` (paged cache,
  random block tables);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on a *contiguous* cache holding the
  same values, ``enable_gqa=True`` (what paging has to compete with);
* ``flex``: FlexAttention (``torch.nn.attention.flex_attention``, ``torch.compile``) reading the
  same paged pool: the pool is one long ``[1, kv_heads, blocks * block_size, head_dim]`` sequence
  and each sequence's block mask lists its physical blocks (taken from the block table) as the KV
  tiles to visit, the recipe of ``torch.nn.attention.experimental._paged_attention``;
* ``gather``: the naive way, gather the blocks into a contiguous tensor, then SDPA;
* ``copy``: a device-to-device copy of as many bytes as the KV read: the practical ceiling.

Reported: time, GB/s = KV bytes read / time (for ``copy``: bytes read + written, i.e. the DRAM
traffic rate a streaming kernel can reach), our share of the copy rate, paged/dense = SDPA time /
our time, and FlexAttention time / our time. Every configuration first checks our output (and
FlexAttention's) against SDPA. Each timing flushes L2 before the call: in serving, a layer's KV
never sits in L2.

Usage (script, never a test)::

    python bench/bench_paged_decode.py --out docs/perf/paged_decode.md      # full sweep
    python bench/bench_paged_decode.py --quick                              # a subset
    python bench/bench_paged_decode.py --targets                            # the 54 target cases
    python bench/bench_paged_decode.py --sweep                              # tuning grid
    python bench/bench_paged_decode.py --split-floor 256,64                 # floor A/B
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mini_vllm.attention import triton_paged_attention as tpa

HEAD_DIM = 128
DTYPE = torch.bfloat16
DEVICE = "cuda"  # --smoke on a machine without a GPU switches to "cpu" (Triton interpreter)
FULL = {
    "batch": [1, 8, 32, 64, 128],
    "context": [512, 2048, 8192, 16384],
    "heads": [(32, 8), (64, 8)],
    "block_size": [16, 32, 128],
}
SMOKE = {  # checks the script's logic in seconds, e.g. on CPU; its numbers mean nothing
    "batch": [2],
    "context": [64],
    "heads": [(4, 2)],
    "block_size": [16],
}
TARGETS = {  # the 54 configurations the targets are stated on (batch >= 32, context >= 2k)
    "batch": [32, 64, 128],
    "context": [2048, 8192, 16384],
    "heads": [(32, 8), (64, 8)],
    "block_size": [16, 32, 128],
}
QUICK = {
    "batch": [1, 32, 128],
    "context": [2048, 16384],
    "heads": [(32, 8)],
    "block_size": [16, 128],
}


# ------------------------------------------------------------------------------------ timing


class Timer:
    """CUDA-event timing with an L2 flush before every call; the median of the repetitions.

    ``triton.testing.do_bench`` repeats until a time budget is spent, which for 10-microsecond
    kernels means thousands of flushes; a fixed small count keeps the full sweep short.
    """

    def __init__(self, flush_mb: int = 512) -> None:
        self.flush = torch.empty(flush_mb * 2**20, dtype=torch.int8, device=DEVICE)

    def __call__(self, fn: Callable[[], object], target_ms: float = 25.0) -> float:
        if DEVICE != "cuda":  # smoke run: one wall-clock call
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        est_ms = (time.perf_counter() - t0) * 1e3 / 3
        reps = int(min(100, max(5, target_ms / max(est_ms, 1e-3))))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


# ------------------------------------------------------------------------------------ setup


@dataclass
class Pool:
    """One paged K/V pool, allocated once for the largest configuration and viewed per block size.

    Keeping the pool's shape fixed keeps FlexAttention's compiled graphs valid across contexts.
    """

    kv: torch.Tensor  # [2, tokens, kv_heads, head_dim]
    tokens: int
    align: int  # every span is a multiple of every block size
    _flex: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def span(self, batch: int, max_context: int, need: int) -> tuple[int, bool]:
        """How many leading tokens of the pool a batch's block tables are drawn from.

        ``batch * max_context`` tokens (at least the total need, and fixed across contexts so
        that FlexAttention's graphs are reused), capped so that a FlexAttention key tensor stays
        below 2**31 elements: torch 2.11's flex-decoding template does not compile with 64-bit
        indexing. Returns the span and whether FlexAttention can run on it.
        """
        per_token = self.kv.shape[2] * self.kv.shape[3]
        cap = (2**31 - 1) // per_token // self.align * self.align
        span = min(batch * max_context, cap, self.tokens)
        if need > span:
            return self.tokens, False
        return span, True

    def head_major(self, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``span`` tokens as separate contiguous ``[1, kv_heads, span, head_dim]`` K
        and V, the layout of torch's FlexAttention ``PagedAttention`` helper (each head's pages
        are contiguous rows): FlexAttention gets plain contiguous keys, no strides for Inductor to
        copy away. One span is kept at a time."""
        if self._flex is None or self._flex[0] != span:
            self._flex = None
            k = self.kv[0, :span].permute(1, 0, 2).contiguous().unsqueeze(0)
            v = self.kv[1, :span].permute(1, 0, 2).contiguous().unsqueeze(0)
            self._flex = (span, k, v)
        return self._flex[1], self._flex[2]

    def caches(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.tokens // block_size, block_size, *self.kv.shape[2:])
        return self.kv[0].view(shape), self.kv[1].view(shape)


@dataclass
class Case:
    batch: int
    context: int
    num_heads: int
    num_kv_heads: int
    block_size: int

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.context * self.num_kv_heads * HEAD_DIM * DTYPE.itemsize

    def label(self) -> str:
        return (
            f"B={self.batch} ctx={self.context} heads={self.num_heads}/{self.num_kv_heads} "
            f"bs={self.block_size}"
        )


def make_inputs(case: Case, pool: Pool, gen: torch.Generator, span: int | None = None) -> dict:
    """Random queries and block tables: a random permutation of the first ``span`` pool tokens'
    blocks (default: the whole pool), so a sequence's blocks are scattered over the pool."""
    kc, vc = pool.caches(case.block_size)
    blocks_per_seq = case.context // case.block_size
    need = case.batch * blocks_per_seq
    span_blocks = (span or pool.tokens) // case.block_size
    if need > span_blocks:
        raise ValueError(f"a span of {span_blocks} blocks is smaller than the {need} needed")
    perm = torch.randperm(span_blocks, device=DEVICE, generator=gen)[:need]
    tables = perm.view(case.batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((case.batch,), case.context, dtype=torch.int32, device=DEVICE)
    q = torch.randn(case.batch, case.num_heads, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    return {"q": q, "kc": kc, "vc": vc, "tables": tables, "seq_lens": seq_lens}


def dense_copy(inp: dict, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The same K/V as a contiguous ``[batch, kv_heads, context, head_dim]`` cache."""
    shape = (case.batch, case.context, case.num_kv_heads, HEAD_DIM)
    k = inp["kc"][inp["tables"].long()].view(shape).transpose(1, 2).contiguous()
    v = inp["vc"][inp["tables"].long()].view(shape).transpose(1, 2).contiguous()
    return k, v


def sdpa_backend() -> list:
    from torch.nn.attention import SDPBackend

    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def run_sdpa(q4: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, backend) -> object:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)


# ------------------------------------------------------------------------------ FlexAttention

# FlexAttention's mask_mod needs per-configuration tensors (the inverse block table, the lengths).
# The compiled graph keeps references to the tensors a mask_mod closed over when it was traced,
# so each (pool, batch, block size) gets one mask_mod over persistent tensors, refilled in place
# for every new configuration; a fresh closure per configuration would either recompile or, with
# module globals, silently read stale tensors.
_FLEX_STATE: dict[tuple[int, int, int], tuple[Callable, torch.Tensor, torch.Tensor, torch.Tensor]]
_FLEX_STATE = {}


def _flex_state(pool_blocks: int, batch: int, block_size: int, device: torch.device):
    key = (pool_blocks, batch, block_size)
    if key not in _FLEX_STATE:
        owner = torch.full((pool_blocks,), -1, dtype=torch.int32, device=device)
        phys_to_logical = torch.full((pool_blocks,), -1, dtype=torch.int32, device=device)
        lens = torch.zeros(batch, dtype=torch.int64, device=device)

        def mask_mod(b, h, q_idx, kv_idx):
            """Visible: the position's block belongs to sequence ``b`` and its logical position
            (through the inverse block table) is below ``seq_lens[b]``. The compiled kernel calls
            it only on the partial last block; eager FlexAttention evaluates it everywhere."""
            page = kv_idx // block_size
            logical = phys_to_logical[page] * block_size + kv_idx % block_size
            return (owner[page] == b) & (logical < lens[b])

        _FLEX_STATE[key] = (mask_mod, owner, phys_to_logical, lens)
    return _FLEX_STATE[key]


def flex_block_mask(
    tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, pool_blocks: int, width: int
):
    """A BlockMask whose KV tiles for sequence ``b`` are the physical blocks of its table.

    All blocks are listed as "partial" blocks, none as "full": with full blocks present, the
    flex-decoding template sizes its KV splits by the whole pool's length instead of the listed
    blocks, which leaves all but the first split idle. When every length is a multiple of the
    block size (as in this benchmark) no position inside a listed block needs masking and the mask
    is the no-op; otherwise ``mask_mod`` hides the tail of the last block. The index tensor has
    ``width`` columns whatever the context (``torch``'s own ``PagedAttention`` helper widens it
    to the pool's block count the same way), so its shape and the compiled graph stay fixed.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, table_width = tables.shape
    device = tables.device
    lens = seq_lens.long()
    num_blocks = ((lens + block_size - 1) // block_size).to(torch.int32)
    cols = torch.arange(table_width, device=device)
    used = cols[None] < num_blocks[:, None]
    indices = torch.zeros(batch, width, dtype=torch.int32, device=device)
    indices[:, :table_width] = torch.where(used, tables, 0)
    mask_mod = None
    if bool((lens % block_size).any()):
        mask_mod, owner, phys_to_logical, state_lens = _flex_state(
            pool_blocks, batch, block_size, device
        )
        pages = tables[used].long()
        rows = torch.arange(batch, device=device)[:, None].expand(-1, table_width)
        owner.fill_(-1)
        phys_to_logical.fill_(-1)
        owner[pages] = rows[used].to(torch.int32)
        phys_to_logical[pages] = cols[None].expand(batch, -1)[used].to(torch.int32)
        state_lens.copy_(lens)
    shape = (batch, 1, 1)
    return BlockMask.from_kv_blocks(
        num_blocks.view(shape),
        indices.view(*shape, width),
        BLOCK_SIZE=(128, block_size),
        mask_mod=mask_mod,
        seq_lengths=(1, pool_blocks * block_size),
        compute_q_blocks=False,
    )


_flex_compiled = None


def flex_decode(q4, k_pool, v_pool, block_mask, scale):
    global _flex_compiled
    if _flex_compiled is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4096)
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled(q4, k_pool, v_pool, block_mask=block_mask, scale=scale, enable_gqa=True)


# ------------------------------------------------------------------------------------ runner


def close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    err = (a.float() - b.float()).abs().max().item()
    return err <= 1e-2 * b.float().abs().max().item() + 2e-3, err


def bench_case(case: Case, pool: Pool, timer: Timer, gen: torch.Generator, opts) -> dict:
    span, flex_fits = pool.span(case.batch, opts.max_context, case.batch * case.context)
    inp = make_inputs(case, pool, gen, span)
    scale = HEAD_DIM**-0.5
    q, kc, vc, tables, seq_lens = (inp[k] for k in ("q", "kc", "vc", "tables", "seq_lens"))
    q4 = q.unsqueeze(2)  # [B, H, 1, D]
    k_dense, v_dense = dense_copy(inp, case)
    row: dict = {"case": case}

    backend = None
    for cand in sdpa_backend():
        try:
            want = run_sdpa(q4, k_dense, v_dense, scale, cand)
            backend = cand
            break
        except RuntimeError:
            continue
    row["sdpa_backend"] = str(backend).split(".")[-1].lower()
    want = want.squeeze(2)

    out = torch.empty_like(q)

    def ours() -> object:
        return tpa.paged_attention_decode(
            q, kc, vc, tables, seq_lens, scale, max_seq_len=case.context, out=out
        )

    ours()
    row["ok"], row["err"] = close(out, want)
    row["triton"] = timer(ours)
    row["sdpa"] = timer(lambda: run_sdpa(q4, k_dense, v_dense, scale, backend))

    shape = (case.batch, case.context, case.num_kv_heads, HEAD_DIM)

    def gather() -> object:
        k = kc[tables.long()].view(shape).transpose(1, 2)
        v = vc[tables.long()].view(shape).transpose(1, 2)
        return run_sdpa(q4, k, v, scale, backend)

    row["gather"] = timer(gather)

    flat = pool.kv.view(-1)
    n = case.kv_bytes // DTYPE.itemsize
    dst = torch.empty(n, dtype=DTYPE, device=DEVICE)
    row["copy"] = timer(lambda: dst.copy_(flat[:n]))

    row["flex"] = None
    if opts.flex and not opts.flex_broken:
        if not flex_fits:
            row["flex_note"] = "n/a (K >= 2^31 elems)"
        elif time.perf_counter() - opts.start > opts.time_budget:
            row["flex_note"] = "skipped (time budget)"
        else:
            try:
                span_blocks = span // case.block_size
                mask = flex_block_mask(tables, seq_lens, case.block_size, span_blocks, span_blocks)
                k_pool, v_pool = pool.head_major(span)
                t0 = time.perf_counter()
                got = flex_decode(q4, k_pool, v_pool, mask, scale).squeeze(2)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                row["flex_compile_s"] = time.perf_counter() - t0
                row["flex_ok"], row["flex_err"] = close(got, want)
                row["flex"] = timer(lambda: flex_decode(q4, k_pool, v_pool, mask, scale))
            except Exception as exc:  # report; after three failures stop trying
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                row["flex_note"] = "failed"
                opts.flex_failures.append(f"{case.label()}: {reason}")
                print(f"FlexAttention failed at {case.label()}: {reason}", flush=True)
                if len(opts.flex_failures) >= 3:
                    opts.flex_broken = reason
    return row  # the dense copies and the copy buffer are freed here


def fmt_row(row: dict) -> list[str]:
    case: Case = row["case"]
    gbs = case.kv_bytes / 1e6  # bytes / ms -> GB/s
    copy_rate = 2 * gbs / row["copy"]
    ours_rate = gbs / row["triton"]
    flex = row.get("flex")
    flex_cell = f"{flex * 1e3:.1f}" if flex else row.get("flex_note", "n/a")
    if flex and not row.get("flex_ok", True):
        flex_cell += " WRONG"
    return [
        str(case.batch),
        str(case.context),
        f"{case.num_heads}/{case.num_kv_heads}",
        str(case.block_size),
        f"{case.kv_bytes / 2**20:.0f}",
        f"{row['triton'] * 1e3:.1f}" + ("" if row["ok"] else " WRONG"),
        f"{ours_rate:.0f}",
        f"{row['sdpa'] * 1e3:.1f}",
        flex_cell,
        f"{row['gather'] * 1e3:.1f}",
        f"{row['copy'] * 1e3:.1f}",
        f"{copy_rate:.0f}",
        f"{ours_rate / copy_rate:.0%}",
        f"{row['sdpa'] / row['triton']:.2f}",
        f"{flex / row['triton']:.2f}" if flex else "n/a",
    ]


HEADER = [
    "batch", "context", "q/kv heads", "block", "KV MiB", "triton us", "triton GB/s", "sdpa us",
    "flex us", "gather us", "copy us", "copy GB/s", "of copy", "paged/dense", "flex/triton",
]  # fmt: skip


def markdown(rows: list[dict], env: str, command: str, notes: list[str]) -> str:
    lines = [
        "# Paged decode attention: Triton kernel vs baselines",
        "",
        env,
        "",
        f"Command: `{command}`",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---:|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(fmt_row(r)) + " |" for r in rows]
    lines += ["", *notes]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> list[str]:
    wrong = [r["case"].label() for r in rows if not r["ok"]]
    flex_wrong = [r["case"].label() for r in rows if r.get("flex") and not r.get("flex_ok", True)]
    lines = [
        "Correctness vs SDPA (checked before timing): triton "
        + (f"WRONG at {wrong}" if wrong else "matches at every config")
        + "; flex "
        + (f"WRONG at {flex_wrong}" if flex_wrong else "matches wherever it ran")
        + "."
    ]
    big = [r for r in rows if r["case"].batch >= 32 and r["case"].context >= 2048]
    if not big:
        return lines
    share = [(r["case"].kv_bytes / r["triton"]) / (2 * r["case"].kv_bytes / r["copy"]) for r in big]
    ratio = [r["sdpa"] / r["triton"] for r in big]
    flex = [r["flex"] / r["triton"] for r in big if r.get("flex")]
    lines += [
        f"Batch >= 32 and context >= 2k ({len(big)} configs): share of copy rate "
        f"min {min(share):.0%} / median {statistics.median(share):.0%}; paged/dense min "
        f"{min(ratio):.2f} / median {statistics.median(ratio):.2f}"
        + (
            f"; flex/triton min {min(flex):.2f} / median {statistics.median(flex):.2f}"
            if flex
            else ""
        )
        + "."
    ]
    return lines


def environment() -> str:
    import triton

    if DEVICE != "cuda":
        return f"Smoke run on CPU (Triton interpreter); torch {torch.__version__}."
    props = torch.cuda.get_device_properties(0)
    return (
        f"Device: {props.name} ({props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB); torch {torch.__version__}, triton "
        f"{triton.__version__}, CUDA {torch.version.cuda}; dtype {str(DTYPE).split('.')[-1]}, "
        f"head_dim {HEAD_DIM}. Times are medians with L2 flushed before each call. GB/s = KV "
        "bytes read / time; copy GB/s counts bytes read + written (DRAM traffic); 'of copy' = "
        "triton GB/s / copy GB/s; paged/dense = SDPA time / triton time."
    )


SWEEP_CASES = [
    Case(32, 2048, 32, 8, 16),
    Case(128, 8192, 32, 8, 16),
    Case(64, 2048, 32, 8, 128),
    Case(32, 8192, 64, 8, 32),
    Case(8, 16384, 32, 8, 128),
]
SWEEP_LAUNCH = [(bn, w, s) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]


def sweep_launch() -> list[tuple[int, int, int]]:
    """The launch grid; small heads also try longer tiles and fewer warps (same bytes per tile)."""
    if HEAD_DIM > 64:
        return SWEEP_LAUNCH
    return [(bn, w, s) for bn in (32, 64, 128, 256) for w in (2, 4, 8) for s in (2, 3, 4)]


def run_sweep(
    pool: Pool,
    timer: Timer,
    gen: torch.Generator,
    budget_s: float,
    cases: list[Case] = SWEEP_CASES,
    launch: list[tuple[int, int, int]] | None = None,
    split_counts: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
) -> None:
    """Tuning grid for the launch options and the split count, on a few representative shapes."""
    start = time.perf_counter()
    scale = HEAD_DIM**-0.5
    for case in cases:
        inp = make_inputs(case, pool, gen)
        args = [inp[k] for k in ("q", "kc", "vc", "tables", "seq_lens")]
        default = tpa.default_num_splits(
            case.batch, case.num_kv_heads, case.context, tpa._num_sms(args[0].device)
        )
        results = []
        for bn, w, s in launch or sweep_launch():
            if time.perf_counter() - start > budget_s:
                break
            try:
                t = timer(
                    lambda args=args, ctx=case.context, bn=bn, w=w, s=s: tpa.paged_attention_decode(
                        *args, scale, max_seq_len=ctx, block_n=bn, num_warps=w, num_stages=s
                    ),
                    target_ms=10,
                )
            except Exception as exc:
                print(f"  {case.label()} bn={bn} w={w} s={s}: {type(exc).__name__}")
                continue
            results.append((t, bn, w, s))
        results.sort()
        gbs = case.kv_bytes / 1e6
        n = case.kv_bytes // DTYPE.itemsize
        dst = torch.empty(n, dtype=DTYPE, device=DEVICE)
        t_copy = timer(lambda dst=dst, n=n: dst.copy_(pool.kv.view(-1)[:n]), target_ms=10)
        k_dense, v_dense = dense_copy(inp, case)
        q4 = args[0].unsqueeze(2)
        t_sdpa = timer(
            lambda q4=q4, k=k_dense, v=v_dense: F.scaled_dot_product_attention(
                q4, k, v, scale=scale, enable_gqa=True
            ),
            target_ms=10,
        )
        del dst, k_dense, v_dense
        print(
            f"sweep {case.label()} default splits={default}: copy {2 * gbs / t_copy:.0f} GB/s, "
            f"sdpa {t_sdpa * 1e3:.1f} us {gbs / t_sdpa:.0f} GB/s"
        )
        one = default == 1
        default_launch = (
            tpa._ONE_SPLIT_BLOCK_N if one else tpa._BLOCK_N,
            tpa._NUM_WARPS,
            tpa._ONE_SPLIT_NUM_STAGES if one else tpa._NUM_STAGES,
        )
        for rank, (t, bn, w, s) in enumerate(results, 1):
            if rank <= 5 or (bn, w, s) == default_launch:
                mark = " (default)" if (bn, w, s) == default_launch else ""
                speed = f"{t * 1e3:.1f} us {gbs / t:.0f} GB/s"
                print(f"  #{rank} block_n={bn} warps={w} stages={s}{mark}: {speed}")
        if not results:
            continue
        _, bn, w, s = results[0]
        for splits in sorted({*split_counts, default}):
            best = {"block_n": bn, "num_warps": w, "num_stages": s}
            t = timer(
                lambda args=args, sp=splits, best=best: tpa.paged_attention_decode(
                    *args, scale, num_splits=sp, **best
                ),
                target_ms=10,
            )
            print(f"  splits={splits:2d}: {t * 1e3:.1f} us {gbs / t:.0f} GB/s")
        sys.stdout.flush()


def run_split_floor(
    pool: Pool, timer: Timer, gen: torch.Generator, grid: dict, floors: list[int]
) -> list[str]:
    """A/B of ``_MIN_TOKENS_PER_SPLIT``: the configurations of ``grid`` whose default split count
    depends on the floor, each timed at its default launch under every floor, interleaved.

    Small batches are launch-bound, and an eager call's time includes the host launching two
    kernels; the engine replays them from a CUDA graph. So each floor is timed both ways: eager,
    and as one captured graph replay (what a decode step pays). Returns the markdown rows.
    """
    scale = HEAD_DIM**-0.5
    sms = tpa._num_sms(torch.device(DEVICE))
    saved = tpa._MIN_TOKENS_PER_SPLIT

    def splits_by_floor(case: Case) -> list[int]:
        counts = []
        for floor in floors:
            tpa._MIN_TOKENS_PER_SPLIT = floor
            counts.append(tpa.default_num_splits(case.batch, case.num_kv_heads, case.context, sms))
        tpa._MIN_TOKENS_PER_SPLIT = saved
        return counts

    cases = [
        Case(batch, context, heads, kv, block_size)
        for block_size in grid["block_size"]
        for heads, kv in grid["heads"]
        for batch in grid["batch"]
        for context in grid["context"]
    ]
    rows = []
    for case in cases:
        splits = splits_by_floor(case)
        if len(set(splits)) == 1:
            continue
        inp = make_inputs(case, pool, gen)
        args = [inp[k] for k in ("q", "kc", "vc", "tables", "seq_lens")]
        out = torch.empty_like(args[0])
        calls: list[Callable[[], object]] = []
        for n in splits:
            call = functools.partial(
                tpa.paged_attention_decode, *args, scale, max_seq_len=case.context,
                num_splits=n, out=out,
            )  # fmt: skip
            call()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            calls += [call, graph.replay]
        times: list[list[float]] = [[] for _ in calls]
        for _ in range(3):  # interleaved rounds: drift hits every floor alike
            for i, call in enumerate(calls):
                times[i].append(timer(call, target_ms=10))
        us = [statistics.median(t) * 1e3 for t in times]
        eager, graphed = us[0::2], us[1::2]
        row = (
            f"| {case.label()} | {' / '.join(map(str, splits))} | "
            f"{' / '.join(f'{t:.1f}' for t in eager)} | "
            f"{' / '.join(f'{t:.1f}' for t in graphed)} | {graphed[0] / graphed[-1]:.2f} |"
        )
        print(row, flush=True)
        rows.append(row)
    floors_txt = " / ".join(map(str, floors))
    return [
        f"| configuration | splits (floor {floors_txt}) | eager µs | graph replay µs | "
        "graph: first floor / last |",
        "|---|---|---|---|---:|",
        *rows,
    ]


def main() -> None:
    global DEVICE, HEAD_DIM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the markdown table here")
    ap.add_argument("--quick", action="store_true", help="a subset of the sweep")
    ap.add_argument(
        "--targets", action="store_true", help="only the 54 configurations the targets cover"
    )
    ap.add_argument("--sweep", action="store_true", help="tuning grid for the kernel, then exit")
    ap.add_argument(
        "--sweep-case",
        action="append",
        default=[],
        metavar="BATCH,CONTEXT,HEADS,KV_HEADS,BLOCK",
        help="with --sweep: tune this configuration instead of the default ones (repeatable)",
    )
    ap.add_argument(
        "--split-floor",
        metavar="A,B",
        help="A/B of the tokens-per-split floor on the configurations it changes, then exit",
    )
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM, help="head size of every case")
    ap.add_argument("--smoke", action="store_true", help="a tiny grid, on CPU if there is no GPU")
    ap.add_argument("--no-flex", dest="flex", action="store_false", help="skip FlexAttention")
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds before flex stops")
    opts = ap.parse_args()
    HEAD_DIM = opts.head_dim
    if not torch.cuda.is_available():
        if not opts.smoke:
            sys.exit("bench_paged_decode.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
        DEVICE = "cpu"
    opts.start = time.perf_counter()
    opts.flex_broken = None
    opts.flex_failures = []
    grid = SMOKE if opts.smoke else QUICK if opts.quick else TARGETS if opts.targets else FULL
    opts.max_context = max(grid["context"])
    env = environment()
    print(env)
    command = "python " + " ".join(sys.argv)

    sweep_cases = [Case(*map(int, c.split(","))) for c in opts.sweep_case] or SWEEP_CASES
    num_kv_heads = {kv for _, kv in grid["heads"]}
    if opts.sweep and not opts.smoke:
        num_kv_heads = {case.num_kv_heads for case in sweep_cases}
    assert len(num_kv_heads) == 1, "one pool shape: all head configs share num_kv_heads"
    lcm = math.lcm(*grid["block_size"])
    tokens = max(grid["batch"]) * max(grid["context"]) + 4 * lcm  # the largest need, plus slack
    tokens = -(-tokens // lcm) * lcm
    pool = Pool(
        torch.randn(2, tokens, num_kv_heads.pop(), HEAD_DIM, device=DEVICE, dtype=DTYPE),
        tokens,
        lcm,
    )
    timer = Timer()
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(0)
    if opts.sweep and opts.smoke:
        smoke_case = Case(2, 64, 4, 2, 16)
        run_sweep(pool, timer, gen, opts.time_budget, [smoke_case], [(16, 4, 2)], (1, 2))
        return
    if opts.sweep:
        run_sweep(pool, timer, gen, opts.time_budget, sweep_cases)
        return
    if opts.split_floor:
        floors = [int(f) for f in opts.split_floor.split(",")]
        table = "\n".join(run_split_floor(pool, timer, gen, grid, floors))
        print(table)
        if opts.out:
            opts.out.write_text(f"{env}\n\nCommand: `{command}`\n\n{table}\n")
        return

    rows: list[dict] = []
    # block size and heads outermost: FlexAttention compiles once per (block size, heads, batch)
    for block_size in grid["block_size"]:
        for num_heads, num_kv in grid["heads"]:
            for batch in grid["batch"]:
                for context in grid["context"]:
                    case = Case(batch, context, num_heads, num_kv, block_size)
                    try:
                        row = bench_case(case, pool, timer, gen, opts)
                    except Exception as exc:  # e.g. out of memory: report, go on
                        print(f"{case.label()}: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    rows.append(row)
                    compile_s = row.get("flex_compile_s")
                    extra = f" flex compile {compile_s:.1f}s" if compile_s else ""
                    elapsed = time.perf_counter() - opts.start
                    print(
                        " | ".join(fmt_row(row)),
                        f"[{row['sdpa_backend']}{extra}; t={elapsed:.0f}s]",
                        flush=True,
                    )
                    if opts.out:
                        notes = summary(rows) + _notes(rows, opts)
                        opts.out.parent.mkdir(parents=True, exist_ok=True)
                        opts.out.write_text(markdown(rows, env, command, notes))
    print("\n".join(["| " + " | ".join(HEADER) + " |", *summary(rows), *_notes(rows, opts)]))


def _notes(rows: list[dict], opts) -> list[str]:
    backends = sorted({r["sdpa_backend"] for r in rows})
    notes = [f"SDPA backend: {', '.join(backends)}."]
    compile_s = [r["flex_compile_s"] for r in rows if "flex_compile_s" in r]
    if compile_s:
        notes.append(
            "FlexAttention: torch.compile(flex_attention) over a head-major copy of the same pool "
            "([1, kv_heads, tokens, head_dim], the layout of torch's PagedAttention helper), "
            "paged through a BlockMask whose KV tiles are each sequence's physical blocks; "
            f"first call per new shape (compilation) took up to {max(compile_s):.1f} s."
        )
    if any(r.get("flex_note", "").startswith("n/a") for r in rows):
        notes.append(
            "flex n/a: the key tensor would hold >= 2^31 elements; the flex-decoding template "
            "then switches to 64-bit indices and fails to compile ('Ternary expression with "
            "dynamic condition has inconsistent types int64 and int32', torch 2.11)."
        )
    for failure in opts.flex_failures:
        notes.append(f"FlexAttention failed at {failure}")
    if opts.flex_broken:
        notes.append("FlexAttention was not tried after three failures.")
    return notes


if __name__ == "__main__":
    main()
