"""Does the host's Python run slower while the GPU computes? A diagnostic for issue #14.

``profile_engine_step.py --idle-gpu-schedule`` once measured ``schedule()`` at 1.48 ms in the
async loop against 0.79 ms when the GPU was drained first, in two separate runs, and the docs
blamed the busy GPU. This script tests that claim two ways, in one process:

1. a fixed piece of pure Python (dict lookups, attribute updates, list appends over 256
   objects, the scheduler's kind of work) timed right after a synchronize (GPU idle) and right
   after queueing GPU work (GPU busy): large matmuls, large copies, and the engine's own
   captured decode graph;
2. the engine's ``schedule()`` and ``update_from_output()`` in alternating windows of
   ``--window`` async steps, the GPU busy (the default loop) or drained before each
   ``schedule()``: one median per window, so that a difference that follows the GPU's state
   shows up window after window, and one that does not shows as spread within a state.

    python bench/host_beside_gpu.py --random-model llama-1b
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import profile_engine_step  # same directory; puts the repository on sys.path
from engine_workload import fill_decode_batch


def pure_python(num_objects: int = 256, reps: int = 30) -> float:
    """Milliseconds of scheduler-like pure Python on a fixed, small working set."""
    items = [{"id": f"req-{i}", "n": 0, "tokens": []} for i in range(num_objects)]
    index = {item["id"]: item for item in items}
    t0 = time.perf_counter()
    for _ in range(reps):
        out = {}
        for item in items:
            req = index[item["id"]]
            req["n"] += 1
            req["tokens"].append(req["n"])
            out[req["id"]] = [req["n"]]
        for item in items:
            item["tokens"].pop()
    return (time.perf_counter() - t0) * 1e3


def idle_vs_busy(label: str, make_busy: Any, trials: int = 15) -> None:
    import torch

    idle, busy = [], []
    for _ in range(trials):
        torch.cuda.synchronize()
        idle.append(pure_python())
        make_busy()
        busy.append(pure_python())
        torch.cuda.synchronize()
    i, b = statistics.median(idle), statistics.median(busy)
    print(f"| {label} | {i:.3f} | {b:.3f} | {b / i:.2f} |")


def pure_python_beside_gpu(engine: Any) -> None:
    import torch

    print("| the same pure Python (ms) | GPU idle | GPU busy | busy / idle |\n|---|---:|---:|---:|")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    idle_vs_busy("beside 40 bf16 matmuls 8192³", lambda: [a @ a for _ in range(40)])
    x = torch.empty(2**30, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    idle_vs_busy("beside 40 copies of 2 GiB", lambda: [y.copy_(x) for _ in range(40)])
    graphs = engine.model_runner.cuda_graphs
    if graphs is not None:
        graph = graphs._graphs[graphs.batch_sizes[-1]]
        idle_vs_busy(
            "beside 3 replays of the decode graph", lambda: [graph.replay() for _ in "abc"]
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--random-model", default="llama-1b")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--context", type=int, default=600)
    p.add_argument("--window", type=int, default=40, help="async steps per window")
    p.add_argument("--windows", type=int, default=8, help="windows, alternating busy and idle")
    args = p.parse_args(argv)
    import torch

    engine_args = argparse.Namespace(
        random_model=args.random_model,
        batch=args.batch,
        context=args.context,
        steps=args.window * (args.windows + 2),  # room in max_model_len for every step
        prefill_tokens=0,
        gpu_memory_utilization=0.8,
        async_scheduling=True,
        device="cuda",
    )
    with tempfile.TemporaryDirectory() as tmp:
        engine = profile_engine_step.build_engine(engine_args, Path(tmp) / "model")
    fill_decode_batch(engine, args.batch, args.context)
    print(f"Device: {torch.cuda.get_device_name()}, {args.random_model} shape\n")

    pure_python_beside_gpu(engine)

    sched = engine.scheduler
    schedule, update = sched.schedule, sched.update_from_output
    timer = profile_engine_step.PhaseTimer()

    def drained(fn: Any) -> Any:
        def wrapper() -> Any:
            torch.cuda.synchronize()  # outside the timing: the timer wraps fn itself
            return fn()

        return wrapper

    print(f"\n| window of {args.window} async steps | GPU during schedule() | `schedule` ms "
          "| `update_from_output` ms | whole step ms |\n|---|---|---:|---:|---:|")  # fmt: skip
    for window in range(args.windows):
        drain = window % 2 == 1
        timed_schedule = timer.wrap("schedule", schedule)
        sched.schedule = drained(timed_schedule) if drain else timed_schedule
        sched.update_from_output = timer.wrap("update", update)
        for _ in range(3):
            engine.step()
        timer.times.clear()
        t0 = time.perf_counter()
        for _ in range(args.window):
            engine.step()
        torch.cuda.synchronize()
        step_ms = (time.perf_counter() - t0) * 1e3 / args.window
        print(
            f"| {window + 1} | {'drained' if drain else 'busy'} "
            f"| {statistics.median(timer.times['schedule']) * 1e3:.3f} "
            f"| {statistics.median(timer.times['update']) * 1e3:.3f} | {step_ms:.3f} |"
        )
    sched.schedule, sched.update_from_output = schedule, update
    return 0


if __name__ == "__main__":
    sys.exit(main())
