"""Command line: ``python -m mini_vllm.teaching.sim --requests 6 --blocks 12 --seed 0``.

Prints the step-by-step schedule (who ran, how many tokens, block tables,
preemptions, KV usage) and checks every request's output against the fake
model. Exits with status 1 if an output differs.
"""

from __future__ import annotations

import argparse
import sys

from mini_vllm.teaching.sim.render import print_result
from mini_vllm.teaching.sim.simulator import SimConfig, Simulator
from mini_vllm.teaching.sim.workload import make_workload


def _range(text: str) -> tuple[int, int]:
    """Parse ``8`` or ``4-20`` into an inclusive range."""
    lo, sep, hi = text.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command-line options."""
    p = argparse.ArgumentParser(
        prog="python -m mini_vllm.teaching.sim",
        description="Simulate mini-vLLM's scheduler and KV cache with a fake model.",
    )
    p.add_argument("--requests", type=int, default=6, help="number of requests")
    p.add_argument("--blocks", type=int, default=12, help="KV cache blocks (null block included)")
    p.add_argument("--block-size", type=int, default=4, help="tokens per block")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the fake model")
    p.add_argument("--max-num-batched-tokens", type=int, default=16, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=4, help="most running requests")
    p.add_argument("--max-model-len", type=int, default=40, help="longest prompt + output")
    p.add_argument("--prompt-len", type=_range, default=(4, 20), help="prompt lengths, LO-HI")
    p.add_argument("--max-tokens", type=_range, default=(2, 12), help="max_tokens, LO-HI")
    p.add_argument(
        "--arrival-gap", type=_range, default=(0, 1), help="steps between arrivals, LO-HI"
    )
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="tokens shared by every prompt (exercises prefix caching)",
    )
    p.add_argument("--vocab-size", type=int, default=64, help="fake vocabulary size")
    p.add_argument("--eos-token-id", type=int, default=None, help="EOS token (default: none)")
    p.add_argument(
        "--long-prefill-threshold",
        type=int,
        default=0,
        help="most tokens per request per step (0: no limit)",
    )
    p.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument(
        "--no-admission-gate",
        action="store_true",
        help="admit a request when its first chunk fits, not its whole sequence",
    )
    p.add_argument(
        "--policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="scheduling policy (priority: smaller --priority values run first)",
    )
    p.add_argument(
        "--priority",
        type=_range,
        default=None,
        help="draw each request's priority from LO-HI (default: all 0)",
    )
    p.add_argument("--plain", action="store_true", help="plain text even if rich is installed")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one simulation and print it; return the exit status."""
    args = build_parser().parse_args(argv)
    config = SimConfig(
        num_gpu_blocks=args.blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=not args.no_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_threshold,
        enable_caching=not args.no_prefix_caching,
        scheduler_reserve_full_isl=not args.no_admission_gate,
        scheduling_policy=args.policy,
        seed=args.seed,
        vocab_size=args.vocab_size,
        eos_token_id=args.eos_token_id,
    )
    workload = make_workload(
        args.requests,
        seed=args.seed,
        prompt_len=args.prompt_len,
        max_tokens=args.max_tokens,
        arrival_gap=args.arrival_gap,
        shared_prefix_len=args.shared_prefix,
        vocab_size=args.vocab_size,
        priority=args.priority,
    )
    try:
        result = Simulator(config, workload).run()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_result(result, plain=args.plain)
    return 1 if result.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
