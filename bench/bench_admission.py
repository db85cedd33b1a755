"""What the admission gate and the scheduling policy do to preemptions, on simulated workloads.

The scheduler's choices, not the model, decide how often a request is preempted and how much
work its recompute throws away, so this runs ``mini_vllm.teaching.sim`` (the reference scheduler
and KV cache manager, with the fake model that checks every output) over many seeded workloads
on a pool too small for them, four ways side by side:

* FCFS, admitting on the first chunk (``scheduler_reserve_full_isl=False``);
* FCFS with the admission gate (upstream's default at the pin, and ours);
* the priority policy, with and without the gate (priorities drawn per request).

Reported per configuration, summed over the workloads: preemptions, tokens computed (prompt and
recompute included: the work the GPU would do), engine steps, and how many requests were
preempted at least once; then each against the first row. Every output is checked against the
fake model: a configuration that produced a wrong token fails the run.

Usage (a script, never a test)::

    python bench/bench_admission.py                       # 200 workloads, seconds on a laptop
    python bench/bench_admission.py --workloads 1000 --requests 12 --blocks 16
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass

from mini_vllm.teaching.sim import SimConfig, make_workload
from mini_vllm.teaching.sim.simulator import Simulator

CONFIGS = [
    ("fcfs, no gate", "fcfs", False),
    ("fcfs, gate (default)", "fcfs", True),
    ("priority, no gate", "priority", False),
    ("priority, gate", "priority", True),
]


@dataclass
class Totals:
    preemptions: int = 0
    preempted_requests: int = 0
    computed_tokens: int = 0
    steps: int = 0


def run(args: argparse.Namespace, policy: str, gate: bool) -> Totals:
    totals = Totals()
    for seed in range(args.workloads):
        config = SimConfig(
            num_gpu_blocks=args.blocks,
            block_size=args.block_size,
            max_num_batched_tokens=args.budget,
            max_model_len=args.max_model_len,
            seed=seed,
            scheduler_reserve_full_isl=gate,
            scheduling_policy=policy,
        )
        workload = make_workload(
            args.requests,
            seed=seed,
            prompt_len=(4, args.max_model_len // 2),
            max_tokens=(2, args.max_model_len // 3),
            priority=(0, 3) if policy == "priority" else None,
        )
        result = Simulator(config, workload).run()
        if result.mismatches:
            sys.exit(f"{policy}, gate={gate}, seed {seed}: outputs differ from the model")
        preemptions = [req.num_preemptions for req in result.requests.values()]
        totals.preemptions += sum(preemptions)
        totals.preempted_requests += sum(n > 0 for n in preemptions)
        totals.computed_tokens += sum(record.num_scheduled_tokens for record in result.steps)
        totals.steps += len(result.steps)
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", type=int, default=200, help="seeded workloads per config")
    p.add_argument("--requests", type=int, default=8, help="requests per workload")
    p.add_argument("--blocks", type=int, default=12, help="KV blocks (null block included)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--budget", type=int, default=16, help="max_num_batched_tokens")
    p.add_argument("--max-model-len", type=int, default=40)
    args = p.parse_args(argv)

    rows = [(name, run(args, policy, gate)) for name, policy, gate in CONFIGS]
    base = rows[0][1]
    print(
        f"# {args.workloads} workloads of {args.requests} requests; {args.blocks} blocks of "
        f"{args.block_size} tokens, budget {args.budget}, max_model_len {args.max_model_len}; "
        f"{platform.python_implementation()} on {platform.machine()} (simulated: device-free)"
    )
    print("| configuration | preemptions | requests preempted | tokens computed | steps |")
    print("|---|---|---|---|---|")
    for name, t in rows:
        print(
            f"| {name} | {t.preemptions} ({t.preemptions / base.preemptions:.2f}x) | "
            f"{t.preempted_requests} | {t.computed_tokens} "
            f"({t.computed_tokens / base.computed_tokens:.3f}x) | {t.steps} "
            f"({t.steps / base.steps:.3f}x) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
