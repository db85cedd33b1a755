"""Where one engine step's time goes: the host phases, the GPU, and the kernels.

``bench_engine.py`` says how fast the engine is; this says why. It fills the engine with
``--batch`` requests of ``--context`` prompt tokens (random weights of a known shape, greedy, EOS
ignored), lets every prefill finish, then times ``--steps`` decode steps phase by phase. By
default async scheduling is off, so that the phases run one after the other and add up to the
step; ``--async-scheduling`` times the engine as it runs by default, where step N+1's
``schedule`` and input preparation overlap step N on the GPU: the phases then show the host's
work per step, and the whole engine step is the period the GPU sees (the step is hidden when
the host's work fits inside the model step).

* ``schedule``: ``Scheduler.schedule()`` (pure Python, per request);
* ``update states`` / ``prepare inputs``: the runner applying the scheduler's diff to its
  persistent ``InputBatch`` and gathering the step's rows into the model's inputs;
* ``model launch``: the forward pass as the host sees it (a CUDA-graph replay is a few copies and
  one launch), ``logits`` and ``sample`` (launches), and ``collect tokens``: the one
  device-to-host read of the step, which waits for the GPU;
* ``update from output``: the scheduler appending tokens, checking stops;
* ``GPU``: CUDA events around the forward pass, the logits and the sampling;
* ``GPU alone``: the step's CUDA graph replayed back to back, which the host cannot delay.

Then one step that holds a prefill (``--prefill-tokens`` new prompt tokens next to the decodes),
and, with ``--profile``, the CUDA kernels of a few decode steps (``torch.profiler``).

    python bench/profile_engine_step.py --random-model smollm2-135m --batch 256 --context 600
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import bench_engine  # noqa: E402  (same directory)
from engine_measure import copy_rate, kv_bytes_per_token, weight_bytes  # noqa: E402
from engine_workload import fill_decode_batch  # noqa: E402


class PhaseTimer:
    """Wall-clock time per named phase, accumulated over wrapped calls."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.times[name].append(time.perf_counter() - t0)

        return timed


def build_engine(args: argparse.Namespace, model_dir: Path) -> Any:
    from mini_vllm.llm import LLM

    prep_args = argparse.Namespace(
        random_model=args.random_model, model_dir=str(model_dir), threads=1, model=None
    )
    bench_engine.stage_prepare(prep_args)
    cuda = args.device == "cuda"
    llm = LLM(
        str(model_dir),
        skip_tokenizer_init=True,
        device=args.device,
        dtype="bfloat16" if cuda else "float32",
        max_model_len=args.context + args.steps + 64 + args.prefill_tokens,
        max_num_seqs=args.batch + 1,
        gpu_memory_utilization=args.gpu_memory_utilization,
        async_scheduling=args.async_scheduling,
    )
    return llm.llm_engine


# --sampling: the requests' SamplingParams beyond max_tokens and ignore_eos.
SAMPLING: dict[str, dict[str, float]] = {
    "greedy": dict(temperature=0.0),
    "random": dict(temperature=0.8, top_p=0.95),
    "penalties": dict(
        temperature=0.8, top_p=0.95, presence_penalty=0.5, frequency_penalty=0.5,
        repetition_penalty=1.1,
    ),
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--random-model", default="smollm2-135m", choices=list(bench_engine.RANDOM_MODELS)
    )
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--context", type=int, default=600)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--prefill-tokens", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--profile", action="store_true", help="list the top CUDA kernels")
    p.add_argument(
        "--async-scheduling",
        action="store_true",
        help="profile the default async loop (phases overlap the GPU) instead of the serial one",
    )
    p.add_argument(
        "--trace-gaps",
        type=int,
        default=0,
        metavar="STEPS",
        help="trace STEPS steps and attribute the GPU's idle time to the host phase running",
    )
    p.add_argument(
        "--idle-gpu-schedule",
        action="store_true",
        help="diagnostic: wait for the GPU to drain before each schedule() (outside its timing), "
        "to compare the scheduler's time beside an idle and a busy GPU",
    )
    p.add_argument(
        "--min-tokens-per-split",
        type=int,
        default=0,
        metavar="N",
        help="the decode kernel's split floor for this run (A/B of _MIN_TOKENS_PER_SPLIT)",
    )
    p.add_argument(
        "--sampling",
        choices=list(SAMPLING),
        default="greedy",
        help="the requests' sampling: greedy, random (temperature, top-p), or random with the "
        "three penalties",
    )
    p.add_argument("--device", default="cuda", help="cpu: only checks the script")
    args = p.parse_args(argv)

    import torch

    from mini_vllm.attention import triton_paged_attention
    from mini_vllm.sampling_params import SamplingParams

    if args.min_tokens_per_split:  # before the engine captures its decode graphs
        triton_paged_attention._MIN_TOKENS_PER_SPLIT = args.min_tokens_per_split

    with tempfile.TemporaryDirectory() as tmp:
        engine = build_engine(args, Path(tmp) / "model")
    runner = engine.model_runner

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    sched = engine.scheduler
    vocab = engine.hf_config.vocab_size
    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(max_tokens=10**6, ignore_eos=True, **SAMPLING[args.sampling])
    fill_decode_batch(engine, args.batch, args.context, params=params)
    for _ in range(5):  # warm
        engine.step()

    timer = PhaseTimer()
    sched.schedule = timer.wrap("schedule", sched.schedule)
    if args.idle_gpu_schedule:
        timed_schedule = sched.schedule

        def schedule_on_idle_gpu() -> Any:
            sync()
            return timed_schedule()

        sched.schedule = schedule_on_idle_gpu
    sched.update_from_output = timer.wrap("update from output", sched.update_from_output)
    runner._update_states = timer.wrap("update states", runner._update_states)
    runner._flatten_step = timer.wrap("prepare inputs", runner._flatten_step)
    runner._run_model = timer.wrap("model launch", runner._run_model)
    runner.model.compute_logits = timer.wrap("logits", runner.model.compute_logits)
    runner._sample = timer.wrap("sample", runner._sample)
    runner.get_output = timer.wrap("collect tokens (waits for the GPU)", runner.get_output)
    original_execute = runner.execute_model
    gpu_ms: list[float] = []

    def execute_with_events(scheduler_output: Any) -> Any:
        if args.device != "cuda":  # (the async loop does not call execute_model)
            return original_execute(scheduler_output)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = original_execute(scheduler_output)
        end.record()
        end.synchronize()
        gpu_ms.append(start.elapsed_time(end))
        return out

    runner.execute_model = execute_with_events
    step_s = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - t0)
    batch = len(sched.running)
    loop = "async scheduling (phases overlap the GPU)" if args.async_scheduling else "serial loop"
    print(
        f"## {args.random_model}: decode steps at batch {batch}, context ~{args.context}, {loop}, "
        f"{args.sampling} sampling\n"
    )
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    floor = triton_paged_attention._MIN_TOKENS_PER_SPLIT
    print(
        f"Device: {device}, torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"split floor {floor} tokens\n"
    )
    print("| phase | median (ms) |\n|---|---:|")
    for name, values in timer.times.items():
        print(f"| {name} | {statistics.median(values[-args.steps :]) * 1e3:.3f} |")
    if gpu_ms:
        print(f"| GPU (events around execute_model) | {statistics.median(gpu_ms):.3f} |")
    print(f"| **whole engine step** | **{statistics.median(step_s) * 1e3:.3f}** |\n")
    if args.device == "cuda":
        print_replay_alone(engine, batch)

    # One step holding a prefill next to the decodes.
    prompt = torch.randint(vocab, (args.prefill_tokens,), generator=gen).tolist()
    engine.add_request("prefill", {"prompt_token_ids": prompt}, params)
    sync()
    t0 = time.perf_counter()
    engine.step()
    sync()
    print(
        f"Step with a {args.prefill_tokens}-token prefill beside {batch} decodes: "
        f"{(time.perf_counter() - t0) * 1e3:.1f} ms (first call of its shapes)"
    )
    engine.abort_request(["prefill"])
    engine.add_request("prefill2", {"prompt_token_ids": prompt[::-1]}, params)
    t0 = time.perf_counter()
    engine.step()
    sync()
    print(f"and again with another prompt: {(time.perf_counter() - t0) * 1e3:.1f} ms\n")
    engine.abort_request(["prefill2"])

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                engine.step()
        print("Top CUDA kernels over 5 decode steps:\n\n```")
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=20, max_name_column_width=60
        )
        print(table)
        print("```")
    if args.trace_gaps and args.device == "cuda":
        trace_gaps(engine, args.trace_gaps)
    return 0


HOST_PHASES = {
    "schedule": ("scheduler", "schedule"),
    "update from output": ("scheduler", "update_from_output"),
    "update states": ("model_runner", "_update_states"),
    "prepare inputs": ("model_runner", "_flatten_step"),
    "launch": ("model_runner", "launch_step"),
    "collect tokens": ("model_runner", "get_output"),
}


def print_replay_alone(engine: Any, batch: int, repeats: int = 50) -> None:
    """The GPU's own time for the last decode step, against its bandwidth floor: its CUDA graph
    replayed back to back (then with the logits and an argmax), nothing on the host between two
    launches. In the engine's loop a step's events also count any wait for the host's launch
    when the host is behind; the difference is that wait. The replays recompute the same step:
    they write the same K/V into the same slots and leave the engine's state as it was."""
    import torch

    runner = engine.model_runner
    graphs = runner.cuda_graphs
    if graphs is None:
        return
    size = next(s for s in graphs.batch_sizes if s >= batch)
    graph, hidden = graphs._graphs[size], graphs._outputs[size]  # a bench may read them

    def per_call_ms(fn: Any) -> float:
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def with_logits() -> None:
        graph.replay()
        runner.model.compute_logits(hidden).argmax(dim=-1)

    with torch.inference_mode():
        alone, alone_logits = per_call_ms(graph.replay), per_call_ms(with_logits)
    context = sum(request.num_computed_tokens for request in engine.scheduler.running)
    dtype_bytes = torch.tensor([], dtype=engine.dtype).element_size()
    read = weight_bytes(engine.model) + context * kv_bytes_per_token(engine.hf_config, dtype_bytes)
    floor_ms = read / copy_rate(torch, "cuda") * 1e3
    print(
        f"GPU alone (the batch-{size} graph replayed {repeats} times back to back): "
        f"{alone:.3f} ms; with the logits and an argmax: {alone_logits:.3f} ms, "
        f"{alone_logits / floor_ms:.2f}x its bandwidth floor ({read / 2**20:,.0f} MiB read: "
        f"{floor_ms:.3f} ms at this GPU's copy rate)\n"
    )


def trace_gaps(engine: Any, steps: int, min_gap_us: float = 5.0) -> None:
    """Trace ``steps`` engine steps and say what the host was doing while the GPU sat idle.

    Every idle stretch between two device operations longer than ``min_gap_us`` is charged to
    the innermost host phase (a ``record_function`` range around each phase) running when the
    GPU went idle; ``(between phases)`` is the engine's own code. Garbage-collector pauses are
    counted separately (their clock is not the trace's).
    """
    import gc
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def annotate(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with record_function(f"host: {name}"):
                return fn(*args, **kwargs)

        return wrapped

    for name, (owner, attr) in HOST_PHASES.items():
        obj = getattr(engine, owner)
        setattr(obj, attr, annotate(name, getattr(obj, attr)))
    gc_pauses: list[float] = []
    gc_start: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start.append(time.perf_counter())
        elif gc_start:
            gc_pauses.append(time.perf_counter() - gc_start.pop())

    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    gc.callbacks.append(on_gc)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    device_ops = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    phases = [
        (e["ts"], e["ts"] + e["dur"], e["name"].removeprefix("host: "))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("host: ")
    ]
    busy_end = device_ops[0][1]
    idle: dict[str, float] = defaultdict(float)
    gaps = 0
    for start, end in device_ops[1:]:
        if start - busy_end > min_gap_us:
            running = [p for p in phases if p[0] <= busy_end < p[1]]
            innermost = min(running, key=lambda p: p[1] - p[0])[2] if running else None
            idle[innermost or "(between phases)"] += start - busy_end
            gaps += 1
        busy_end = max(busy_end, end)
    span = busy_end - device_ops[0][0]
    total_idle = sum(idle.values())
    print(f"### GPU idle time over {steps} async steps ({wall / steps * 1e3:.3f} ms a step)\n")
    print(f"Device busy span {span / steps / 1e3:.3f} ms a step, of which idle in gaps over")
    print(f"{min_gap_us:.0f} µs: {total_idle / steps / 1e3:.3f} ms a step ({gaps} gaps).\n")
    print("| host phase running when the GPU went idle | idle ms per step |\n|---|---:|")
    for name, us in sorted(idle.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {us / steps / 1e3:.3f} |")
    print(
        f"\nGarbage collector: {len(gc_pauses)} pauses, {sum(gc_pauses) * 1e3:.2f} ms in all, "
        f"longest {max(gc_pauses, default=0) * 1e3:.2f} ms.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
