"""Tensor parallelism on one host: TP=1 against TP=N, throughput, KV blocks and the all-reduce.

Tensor parallelism splits every weight matrix, so each rank reads 1/N of the weights per decode
step, and pays for it with two all-reduces per layer (after ``o_proj`` and ``down_proj``), one
after the vocab-parallel embedding and an all-gather of the logits. Whether N ranks beat one
depends on how the saved weight reads compare with those collectives, at this model size and
batch. This script measures, for each size, on the same random-weight checkpoint:

* output tokens/s over an offline workload (nano-vllm's benchmark by default: ``--scale nano``,
  all requests at once, greedy, EOS ignored, each request its own output length);
* at a fixed decode batch (``--batch`` requests of ``--context`` prompt tokens) the decode step
  period (wall time per ``engine.step()`` in steady state, async scheduling on,
  as the engine runs), and the speed-up and scaling efficiency (speed-up / N) over TP=1;
* from ``torch.profiler`` on every rank (``Worker.profile``, upstream's name): the device time
  of all kernels per step, of NCCL's kernels (``nccl*``) alone, and their share of the step.
  An all-reduce kernel also waits for the slower rank, so its time includes any skew;
* the KV cache each configuration gets: blocks, tokens, and how many requests of this context
  fit at once (each rank holds 1/N of the KV heads, so the same memory holds N× the tokens
  while the weights shrink to 1/N).

Each configuration runs in its own process (the GPU memory of one cannot limit the next).

    python bench/bench_tp.py --random-model llama-1b --tensor-parallel-size 1,2 \\
        --out docs/perf/tp_h200_llama1b.md
    python bench/bench_tp.py --random-model tiny --device cpu --scale smoke --batch 4 \\
        --context 32 --steps 4      # checks the script on a laptop (gloo, no device kernels)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine_measure import resolve_device, torch_setup  # noqa: E402  (same directory)
from engine_systems import _drive  # noqa: E402
from engine_workload import (  # noqa: E402
    RANDOM_MODELS,
    SCALES,
    fill_decode_batch,
    make_workload,
    stage_prepare,
)


def is_collective(kernel: str) -> bool:
    return kernel.lower().startswith("nccl")


def profile_steps(engine: Any, num_steps: int) -> list[dict[str, tuple[int, float]]]:
    """Kernel times of ``num_steps`` engine steps, one dict per rank."""
    from mini_vllm.executor.multiproc_executor import MultiprocExecutor
    from mini_vllm.worker.profiler import KernelProfiler

    executor = engine.model_runner
    if isinstance(executor, MultiprocExecutor):
        executor.collective_rpc("profile", args=(True,))
        for _ in range(num_steps):
            engine.step()
        return executor.collective_rpc("profile", args=(False,))
    profiler = KernelProfiler()
    profiler.start()
    for _ in range(num_steps):
        engine.step()
    return [profiler.stop()]


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration, in this process: the offline workload, then the decode-step profile."""
    device = resolve_device(args.device)
    torch_setup(device, 1)
    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    tp = args.child_tp
    scale = SCALES[args.scale]
    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]
    requests = make_workload(**scale, seed=0, vocab_size=vocab)
    step_len = args.context + 2 * (args.warmup + args.steps + args.profile_steps) + 64
    t0 = time.perf_counter()
    llm = LLM(
        args.model_dir,
        skip_tokenizer_init=True,
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        max_model_len=max(step_len, scale["max_input"] + scale["max_output"]),
        max_num_seqs=max(args.batch, args.max_num_seqs),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=tp,
    )
    load_s = time.perf_counter() - t0
    engine = llm.llm_engine
    sched = engine.scheduler
    # Warm the paths CUDA graphs do not cover (prefill shapes, Triton compilation), untimed.
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate([{"prompt_token_ids": r["prompt"][:32]} for r in requests[:4]], warm)
    offline = _drive(engine, requests, [0.0] * len(requests), float("inf"))
    engine.kv_cache_manager.reset_prefix_cache()

    fill_decode_batch(engine, args.batch, args.context)
    for _ in range(args.warmup):
        engine.step()
    periods = []
    for _ in range(args.steps):
        t = time.perf_counter()
        engine.step()
        periods.append(time.perf_counter() - t)
    step_s = statistics.median(periods)
    per_rank = profile_steps(engine, args.profile_steps)
    ranks = []
    for times in per_rank:
        total = sum(us for _, us in times.values())
        coll = {k: v for k, v in times.items() if is_collective(k)}
        ranks.append(
            {
                "kernel_ms_per_step": total / 1e3 / args.profile_steps,
                "collective_ms_per_step": sum(us for _, us in coll.values())
                / 1e3
                / args.profile_steps,
                "collectives_per_step": sum(n for n, _ in coll.values()) / args.profile_steps,
                "collective_kernels": sorted(coll),
            }
        )
    block_size = engine.block_size
    result = {
        "tp": tp,
        "load_s": load_s,
        "offline_tok_per_s": offline["tok_per_s"],
        "offline_s": offline["elapsed"],
        "batch": len(sched.running),
        "step_ms": step_s * 1e3,
        "step_ms_p90": statistics.quantiles(periods, n=10)[-1] * 1e3
        if len(periods) > 1
        else step_s * 1e3,
        "ranks": ranks,
        "num_gpu_blocks": engine.num_gpu_blocks,
        "kv_block_bytes_per_rank": engine.model_runner.kv_cache_block_bytes,
        "kv_tokens": engine.num_gpu_blocks * block_size,
        "fits_at_context": engine.num_gpu_blocks // -(-args.context // block_size),
        "cuda_graphs": not args.enforce_eager and device == "cuda",
    }
    engine.shutdown()
    return result


def workload_text(args: argparse.Namespace) -> str:
    scale = SCALES[args.scale]
    return (
        f"{scale['num_requests']} requests at once, inputs uniform in [{scale['min_input']}, "
        f"{scale['max_input']}], outputs in [{scale['min_output']}, {scale['max_output']}] tokens"
    )


def report(args: argparse.Namespace, results: list[dict[str, Any]], env: str) -> str:
    lines = [
        f"## Decode step under tensor parallelism: {args.random_model} shape, random weights",
        "",
        f"{env}. Offline: {workload_text(args)}. Decode step: batch {args.batch} requests of "
        f"{args.context} prompt tokens, {args.steps} timed steps (median period of "
        f"`engine.step()`), {args.profile_steps} "
        f"profiled; CUDA graphs {'on' if results and results[0].get('cuda_graphs') else 'off'}.",
        "",
        "Command: `python bench/bench_tp.py "
        + " ".join(a for a in sys.argv[1:] if not a.startswith("--child"))
        + "`",
        "",
        "| TP | output tok/s | throughput scaling efficiency | decode step (ms) | speed-up "
        "| step scaling efficiency | kernels busy / step, rank 0 "
        "(ms) | NCCL / step, rank 0 (ms) | NCCL share of the step | collectives / step "
        "| KV blocks | KV tokens | requests of this context that fit |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = next((r for r in results if r.get("tp") == 1), None)
    for r in results:
        if "error" in r:
            lines.append(f"| {r.get('tp', '?')} | failed: {r['error']} |")
            continue
        rank0 = r["ranks"][0]
        speedup = base["step_ms"] / r["step_ms"] if base else float("nan")
        tput = r["offline_tok_per_s"] / base["offline_tok_per_s"] if base else float("nan")
        share = rank0["collective_ms_per_step"] / r["step_ms"]
        lines.append(
            f"| {r['tp']} | {r['offline_tok_per_s']:,.0f} | {tput / r['tp']:.0%} "
            f"| {r['step_ms']:.2f} | {speedup:.2f}× | {speedup / r['tp']:.0%} "
            f"| {rank0['kernel_ms_per_step']:.2f} | {rank0['collective_ms_per_step']:.2f} "
            f"| {share:.0%} | {rank0['collectives_per_step']:.0f} | {r['num_gpu_blocks']:,} "
            f"| {r['kv_tokens']:,} | {r['fits_at_context']:,} |"
        )
    lines.append("")
    for r in results:
        if "error" not in r and r["tp"] > 1:
            kernels = sorted({k for rank in r["ranks"] for k in rank["collective_kernels"]})
            per_rank = ", ".join(
                f"rank {i}: {rank['collective_ms_per_step']:.2f} ms"
                for i, rank in enumerate(r["ranks"])
            )
            lines.append(f"TP={r['tp']}: NCCL per step {per_rank}; kernels: {', '.join(kernels)}.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--random-model", default="llama-1b", choices=list(RANDOM_MODELS))
    p.add_argument("--model-dir", default=None, help="an existing checkpoint of that shape")
    p.add_argument("--tensor-parallel-size", default="1,2", help="comma-separated sizes")
    p.add_argument("--scale", choices=list(SCALES), default="nano", help="the offline workload")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per configuration")
    p.add_argument("--out", type=Path, default=None, help="markdown report (and .json beside it)")
    p.add_argument("--child-tp", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_tp is not None:
        Path(args.child_json).write_text(json.dumps(run_one(args)))
        sys.stdout.flush()
        os._exit(0)  # leave no library thread holding the process open
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = str(Path(tmp) / "model")
            stage_prepare(
                argparse.Namespace(
                    random_model=args.random_model, model_dir=model_dir, threads=1, model=None
                )
            )
        results = []
        for tp in (int(x) for x in args.tensor_parallel_size.split(",")):
            out = Path(tmp) / f"tp{tp}.json"
            cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
            cmd += ["--model-dir", model_dir, "--child-tp", str(tp), "--child-json", str(out)]
            try:
                proc = subprocess.run(cmd, timeout=args.timeout, capture_output=True, text=True)
                if proc.returncode != 0 or not out.exists():
                    results.append({"tp": tp, "error": proc.stderr.strip()[-600:]})
                else:
                    results.append(json.loads(out.read_text()))
            except subprocess.TimeoutExpired:
                results.append({"tp": tp, "error": f"timed out after {args.timeout:.0f} s"})
            print(json.dumps(results[-1])[:2000], flush=True)
    import torch

    env = (
        f"{torch.cuda.device_count()}× {torch.cuda.get_device_name()}"
        if torch.cuda.is_available()
        else "CPU (gloo; no device kernels, so the NCCL columns read 0)"
    ) + f", torch {torch.__version__}"
    text = report(args, results, env)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
