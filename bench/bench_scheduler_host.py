"""The scheduler's host time per engine step, on the CPU alone (no model, no GPU).

At batch 256 an engine step spends milliseconds of pure Python in ``Scheduler.schedule()`` and
``Scheduler.update_from_output()`` (``bench/profile_engine_step.py`` measures them inside the
real engine). Those costs do not depend on the GPU, so this script measures them here, on any
machine: the real ``Scheduler`` / ``AsyncScheduler`` and ``KVCacheManager``, ``--batch``
requests of about ``--prompt-len`` tokens, driven into steady decode, with the sampled tokens
made up by the simulator's fake model (``fake_next_token``, outside the timed region) and fed
back through ``update_from_output`` as the engine does:

* sync: ``schedule()``, then ``update_from_output()`` of that step;
* async (the engine's default): ``schedule()`` of step N+1 while step N is "in flight", then
  ``update_from_output()`` of step N, so every request carries an output placeholder.

Prompts are staggered in length (``prompt_len + i % block_size``) so that each step a
``1/block_size`` share of the batch crosses a block boundary, as in a real batch, instead of all
requests allocating on the same step. Per configuration it reports the median over ``--steps``
decode steps of ``schedule()``, ``update_from_output()`` and their sum, in ms per step and µs
per request, the mean of the sum, and the share of ``schedule()`` spent in
``KVCacheManager.allocate_slots`` (timed in a second pass with a wrapper, so that the wrapper
does not inflate the first). Times are the process's CPU time by default (``--clock cpu``): on a
shared machine the elapsed time also counts whatever ran on the core meanwhile, and varies by 2x
from run to run. A digest of every scheduler output and every token is printed too: two
versions of the scheduler that print the same digest made the same decisions.

These are CPU numbers of the scheduler alone: compare them as ratios (before/after, per request),
not with GPU step times measured elsewhere.

Usage (a script, never a test)::

    python bench/bench_scheduler_host.py                         # 4 configurations, ~10 s
    python bench/bench_scheduler_host.py --profile async+cache   # cProfile of one configuration
    PYTHONPATH=/tmp/old python bench/bench_scheduler_host.py     # another copy of mini_vllm
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import mini_vllm
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mini_vllm

from mini_vllm.core.kv_cache_manager import KVCacheManager, cdiv
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.core.sched.async_scheduler import AsyncScheduler
from mini_vllm.core.sched.output import SchedulerOutput
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams

try:  # the simulator's fake model: the token at a position is a keyed hash of it
    from mini_vllm.teaching.sim.fake_model import fake_next_token
except ImportError:  # an older layout (mini_vllm/sim), e.g. a copy of mini_vllm before a change
    from mini_vllm.sim.fake_model import fake_next_token  # type: ignore[no-redef]

# name -> (async scheduling, prefix caching). The engine's default is async with caching.
CONFIGS: dict[str, tuple[bool, bool]] = {
    "sync": (False, False),
    "sync+cache": (False, True),
    "async": (True, False),
    "async+cache": (True, True),
}
VOCAB_SIZE = 32_000
SEED = 0
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


@dataclass
class Result:
    """Per-step wall times (seconds) of one configuration, and the digest of its trace."""

    schedule: list[float]
    update: list[float]
    allocate: list[float]
    digest: str


class Harness:
    """A scheduler filled with ``batch`` requests, and one engine loop over it."""

    def __init__(self, args: argparse.Namespace, async_scheduling: bool, caching: bool) -> None:
        self.async_scheduling = async_scheduling
        bs = args.block_size
        max_tokens = args.warmup + args.steps + 64
        longest = args.prompt_len + bs + max_tokens
        self.max_model_len = longest + bs
        num_gpu_blocks = args.batch * cdiv(longest, bs) + 1 + 64
        self.kv = KVCacheManager(
            num_gpu_blocks, bs, self.max_model_len, enable_caching=caching, log_stats=True
        )
        cls = AsyncScheduler if async_scheduling else Scheduler
        self.sched = cls(
            self.kv,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.batch,
            max_model_len=self.max_model_len,
        )
        hasher = get_request_block_hasher(bs, sha256) if caching else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for i in range(args.batch):
            rid = f"req-{i}"
            n = args.prompt_len + i % bs
            prompt = [fake_next_token(SEED + 1, rid, p, VOCAB_SIZE) for p in range(n)]
            request = Request(rid, prompt, params, arrival_time=float(i), block_hasher=hasher)
            self.sched.add_request(request)
        self.in_flight: tuple[SchedulerOutput, list[str]] | None = None
        self.digest = hashlib.sha256()

    def _sampling(self, out: SchedulerOutput) -> list[str]:
        """The requests that sample a token in ``out`` (right after its ``schedule()``)."""
        requests = self.sched.requests
        return [rid for rid in out.num_scheduled_tokens if not requests[rid].is_prefill_chunk]

    def _fake_tokens(self, sampling: list[str]) -> dict[str, list[int]]:
        tokens: dict[str, list[int]] = {}
        for rid in sampling:
            request = self.sched.requests.get(rid)
            if request is not None:
                position = request.num_tokens
                tokens[rid] = [fake_next_token(SEED, rid, position, VOCAB_SIZE)]
        return tokens

    def _record(self, out: SchedulerOutput, outputs: list[Any] | None = None) -> None:
        cached = out.scheduled_cached_reqs
        self.digest.update(
            repr(
                (
                    sorted(out.num_scheduled_tokens.items()),
                    [
                        (n.req_id, n.block_ids, n.num_computed_tokens)
                        for n in out.scheduled_new_reqs
                    ],
                    cached.req_ids,
                    cached.new_block_ids,
                    cached.num_computed_tokens,
                    cached.num_output_tokens,
                    cached.new_token_ids,
                    sorted(out.finished_req_ids),
                    sorted(out.preempted_req_ids),
                )
            ).encode()
        )
        if outputs is not None:
            self.digest.update(
                repr([(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs]).encode()
            )

    def step(self) -> tuple[float, float]:
        """One engine step; returns the seconds spent in schedule() and update_from_output()."""
        sched = self.sched
        if not self.async_scheduling:
            t0 = clock()
            out = sched.schedule()
            t1 = clock()
            self._record(out)
            tokens = self._fake_tokens(self._sampling(out))
            t2 = clock()
            outputs = sched.update_from_output(out, tokens)
            t3 = clock()
            self._record(out, outputs)
            return t1 - t0, t3 - t2
        # Async: plan the next step while the previous one is on the "GPU", then apply it.
        if self.in_flight is None:
            first = sched.schedule()
            self.in_flight = (first, self._sampling(first))
        prev_out, prev_sampling = self.in_flight
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        self._record(out)
        self.in_flight = (out, self._sampling(out))
        tokens = self._fake_tokens(prev_sampling)
        t2 = clock()
        outputs = sched.update_from_output(prev_out, tokens)
        t3 = clock()
        self._record(prev_out, outputs)
        return t1 - t0, t3 - t2

    def fill(self, warmup: int) -> None:
        """Run every prefill, then ``warmup`` decode steps, untimed."""
        for _ in range(10_000):
            if all(r.num_output_tokens > 0 for r in self.sched.requests.values()):
                break
            self.step()
        else:
            raise RuntimeError("the prefills did not finish")
        for _ in range(warmup):
            self.step()
        if len(self.sched.running) != len(self.sched.requests):
            raise RuntimeError("not every request is running: is the KV cache too small?")


def wrap_allocate_slots(kv: KVCacheManager, times: list[float]) -> None:
    """Accumulate the time of every ``allocate_slots`` call into ``times[-1]``."""
    inner: Callable[..., Any] = kv.allocate_slots

    def timed(*a: Any, **kw: Any) -> Any:
        t0 = clock()
        try:
            return inner(*a, **kw)
        finally:
            times[-1] += clock() - t0

    kv.allocate_slots = timed  # type: ignore[method-assign]


def run_config(args: argparse.Namespace, name: str) -> Result:
    async_scheduling, caching = CONFIGS[name]
    h = Harness(args, async_scheduling, caching)
    h.fill(args.warmup)
    apply_gc_mode(args.gc)
    schedule, update = [], []
    for _ in range(args.steps):
        s, u = h.step()
        schedule.append(s)
        update.append(u)
    if len(h.sched.running) != args.batch:
        raise RuntimeError("a request finished or was preempted during the timed steps")
    digest = h.digest.hexdigest()[:16]

    # Second pass, same workload: the allocate_slots share of schedule().
    gc.enable()
    gc.unfreeze()
    h2 = Harness(args, async_scheduling, caching)
    h2.fill(args.warmup)
    apply_gc_mode(args.gc)
    allocate: list[float] = []
    wrap_allocate_slots(h2.kv, allocate)
    for _ in range(args.steps):
        allocate.append(0.0)
        h2.step()
    gc.enable()
    gc.unfreeze()
    return Result(schedule, update, allocate, digest)


def apply_gc_mode(mode: str) -> None:
    """``on``: the collector as the engine runs it; ``freeze``: ``gc.freeze()`` after the
    warm-up, as upstream's engine core does after start-up (the objects alive then are never
    scanned again); ``off``: no collection during the timed steps."""
    if mode == "freeze":
        gc.collect()
        gc.freeze()
    elif mode == "off":
        gc.disable()


def profile_config(args: argparse.Namespace, name: str) -> None:
    async_scheduling, caching = CONFIGS[name]
    h = Harness(args, async_scheduling, caching)
    h.fill(args.warmup)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        h.step()
    prof.disable()
    print(f"cProfile of {args.steps} steps of {name!r} (harness included: _fake_tokens, _record)")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, Python {platform.python_version()} ({platform.python_implementation()})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=600)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=200, help="timed decode steps per configuration")
    p.add_argument("--warmup", type=int, default=20, help="untimed decode steps first")
    p.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}"
    )
    p.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="cpu",
        help="cpu (default): the process's CPU time, which leaves out the time the OS "
        "gave the core to other processes (stable on a shared machine); wall: "
        "elapsed time",
    )
    p.add_argument(
        "--gc",
        choices=["on", "freeze", "off"],
        default="on",
        help="the garbage collector during the timed steps (default: on, as the engine)",
    )
    p.add_argument(
        "--profile",
        metavar="CONFIG",
        choices=list(CONFIGS),
        help="print a cProfile of one configuration instead of the table",
    )
    args = p.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]

    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}")
    print(f"mini_vllm: {Path(mini_vllm.__file__).parent}")
    print(
        f"batch {args.batch}, prompts {args.prompt_len}..{args.prompt_len + args.block_size - 1}"
        f" tokens, block size {args.block_size}, {args.steps} decode steps, gc {args.gc}, "
        f"clock {args.clock}"
    )
    if args.profile:
        profile_config(args, args.profile)
        return 0

    ms = 1e3
    us_per_req = 1e6 / args.batch
    header = (
        f"{'config':<12} {'schedule ms':>11} {'update ms':>10} {'total ms':>9} "
        f"{'µs/req':>7} {'mean ms':>8} {'alloc ms':>9} {'alloc %':>8}  digest"
    )
    print(header)
    print("-" * len(header))
    for name in args.configs.split(","):
        r = run_config(args, name)
        s = statistics.median(r.schedule)
        u = statistics.median(r.update)
        totals = [a + b for a, b in zip(r.schedule, r.update)]
        total = statistics.median(totals)
        mean = statistics.fmean(totals)
        a = statistics.median(r.allocate)
        print(
            f"{name:<12} {s * ms:>11.3f} {u * ms:>10.3f} {total * ms:>9.3f} "
            f"{total * us_per_req:>7.2f} {mean * ms:>8.3f} {a * ms:>9.3f} {a / s:>8.0%}  "
            f"{r.digest}"
        )
    print(
        "medians over the steps; µs/req: total per request; mean ms: the mean total (garbage "
        "collections included; with --clock wall also any time the OS gave the core to another "
        "process); alloc: time inside allocate_slots (second pass, wrapped), as a share of "
        "schedule()"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
