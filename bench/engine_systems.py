"""The systems the engine benchmark compares, one stage each, run in a child process.

* :func:`stage_mini`: mini-vLLM's ``LLMEngine`` (optionally over ``--tensor-parallel-size``
  ranks), offline and under Poisson arrivals, with its decode step timed against the
  bandwidth floor;
* :func:`stage_hf_static`: ``model.generate`` on static, left-padded batches;
* :func:`stage_hf_cb`: transformers' continuous batching, driven through its manager.

Each stage takes the parsed arguments and the workload and returns a JSON-able dict of figures;
``engine_report`` turns those into tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from engine_measure import (
    copy_rate,
    kv_bytes_per_token,
    latency_summary,
    model_dtype,
    peak_memory_beyond,
    resolve_device,
    sync,
    torch_setup,
    weight_bytes,
)
from engine_workload import poisson_arrivals

SYSTEMS = ("mini", "hf-static", "hf-cb")
LABELS = {"mini": "mini-vLLM", "hf-static": "HF static", "hf-cb": "HF continuous"}


def _mini_engine(args: argparse.Namespace, device: str, max_model_len: int) -> Any:
    from mini_vllm.llm import LLM

    kwargs: dict[str, Any] = dict(
        skip_tokenizer_init=True,
        device=device,
        dtype=args.dtype,
        max_model_len=max_model_len,
        max_num_seqs=args.max_num_seqs,
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


def _drive(
    engine: Any, requests: list[dict[str, Any]], arrivals: list[float], stop_at: float
) -> dict[str, Any]:
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
            params = SamplingParams(
                temperature=0.0, max_tokens=requests[i]["output_len"], ignore_eos=True
            )
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
    return {
        "elapsed": elapsed,
        "output_tokens": generated,
        "finished": len(finish),
        "requests": len(requests),
        "partial": partial,
        "tok_per_s": generated / elapsed,
        "req_per_s": len(finish) / elapsed,
        **latency_summary(ttft, tpot),
    }


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
    llm.generate(
        warm, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
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
            "reqs": len(prepared.req_ids),
            "tokens": int(inputs.query_start_loc[-1]),
            "context": int(inputs.seq_lens.sum()),
            "decode_only": inputs.max_query_len == 1,
            "period": period,
            "launch_s": time.perf_counter() - t0,
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
            step["s"] = (
                events[0].elapsed_time(events[1]) / 1e3 if events else step["launch_s"] + wait
            )
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
        "cuda_graphs": bool(getattr(runner, "cudagraph_batch_sizes", None)),
        "use_triton": bool(getattr(runner, "use_triton", False)),
        "tensor_parallel_size": args.tensor_parallel_size,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "max_num_seqs": engine.max_num_seqs,
    }
    if device == "cuda" and not tp:
        result["mem_beyond_weights"] = int(
            torch.cuda.max_memory_allocated() - weight_bytes(engine.model)
        )
        result["mem_note"] = "includes the whole preallocated KV cache"
    if not tp:
        runner.launch_step, runner.get_output = original_launch, original_collect

    # Decode step time at the largest decode batch against the bandwidth floor.
    decode = [s for s in steps if s["decode_only"]]
    if decode:
        top = max(s["reqs"] for s in decode)
        at_top = [s for s in decode if s["reqs"] == top]
        w = weight_bytes(engine.model)
        per_token = kv_bytes_per_token(
            engine.hf_config, torch.tensor([], dtype=engine.dtype).element_size()
        )
        kv_read = statistics.median(s["context"] for s in at_top) * per_token
        timed_steps = at_top[1:] or at_top  # the first one's period spans the start-up
        step_s = statistics.median(s["s"] for s in timed_steps)
        periods = [s["period"] for s in timed_steps if s["period"]]
        engine_s = statistics.median(periods) if periods else step_s
        result["decode"] = {
            "batch": top,
            "steps": len(at_top),
            "step_s": step_s,
            "engine_step_s": engine_s,
            "mean_context": statistics.mean(s["context"] / top for s in at_top),
            "weight_bytes": w,
            "kv_read_bytes": kv_read,
        }
        if device == "cuda":
            rate = copy_rate(torch, device)
            floor = (w + kv_read) / rate
            result["decode"].update(copy_rate=rate, floor_s=floor, ratio=step_s / floor)
    result["steps"] = {
        "total": len(steps),
        "decode_only": len(decode),
        "model_s": sum(s["s"] for s in steps),
        "mixed_s": sum(s["s"] for s in steps if not s["decode_only"]),
    }

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
            return torch.full(
                (input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device
            )

    return StepRecorder()


def _load_hf(args: argparse.Namespace, device: str, **kwargs: Any) -> Any:
    import transformers

    dtype = model_dtype(device, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=dtype, local_files_only=True, **kwargs
    )
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
            ids[row, width - n :] = torch.tensor(r["prompt"])
            mask[row, width - n :] = 1
        max_new = max(r["output_len"] for r in batch)
        with torch.no_grad():
            model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                pad_token_id=pad,
                stopping_criteria=StoppingCriteriaList([recorder]),
            )

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
        batch = requests[k * batch_size : (k + 1) * batch_size]
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
        "tok_per_s": useful / total_s,
        "output_tokens": useful,
        "elapsed": elapsed,
        "estimated": bool(stopped_at),
        "stopped_at": stopped_at,
        "batch_size": batch_size,
        "kv_peak_bytes": kv_peak,
        "mem_beyond_weights": peak_memory_beyond(torch, device, weights),
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
    gen_cfg = GenerationConfig(
        do_sample=False, max_new_tokens=max_out, eos_token_id=-1, pad_token_id=0
    )
    kwargs: dict[str, Any] = {"generation_config": gen_cfg}
    if "workload_hints" in inspect.signature(model.init_continuous_batching).parameters:
        try:
            from transformers.generation.continuous_batching.continuous_api import WorkloadHints

            kwargs["workload_hints"] = WorkloadHints(
                max_prompt_length=max(len(r["prompt"]) for r in requests),
                max_generated_length=max_out,
                num_requests=len(requests),
            )
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
            in_flight = sum(
                state.generated_len() for rid, state in list(active.items()) if rid in added_at
            )
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
        "tok_per_s": (tokens + in_flight) / elapsed,
        "output_tokens": tokens + in_flight,
        "elapsed": elapsed,
        "finished": len(finished),
        "requests": len(requests),
        "estimated": len(finished) < len(requests),
        "note": note,
        "errors": errors,
        "attn": getattr(model.config, "_attn_implementation", None),
        "kv_peak_bytes": None,
        "mem_beyond_weights": peak_memory_beyond(torch, device, weights),
        **latency_summary(ttft, tpot),
    }
