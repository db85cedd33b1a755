"""Online serving benchmark: Poisson arrivals through HTTP with the real ``openai`` client.

Modelled on upstream's ``vllm bench serve`` (``vllm/benchmarks/serve.py``): requests arrive as a
Poisson process at each rate given (``inf`` sends them all at once), each is a streaming
completion with a fixed number of output tokens (``ignore_eos``), and the client measures what a
user feels:

* **TTFT**, time to first token: send -> first streamed text;
* **TPOT**, time per output token of a request: (last token - first token) / (tokens - 1);
* **ITL**, inter-token latency: every gap between two streamed chunks, over all requests;
* throughput (output tokens/s, requests/s) over the whole run, and **goodput**: requests/s that
  met both SLOs (``--slo-ttft``, ``--slo-tpot``).

The server is either started here (``--model``; the same ``python -m mini_vllm serve`` a user
runs, stopped at the end) or an existing one (``--base-url``, any OpenAI-compatible server).
``--transformers-model DIR`` then runs the same requests, in the same run, against Hugging
Face's own OpenAI-compatible server (``transformers serve DIR --continuous-batching``); it
refuses ``ignore_eos``, so both systems then stop at EOS (greedy: the same outputs).

    python bench/bench_serving.py --rates 1 4 inf --num-prompts 32 --out build/serving_cpu.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

WORDS = [
    "memory",
    "block",
    "cache",
    "token",
    "request",
    "batch",
    "engine",
    "server",
    "stream",
    "prompt",
    "sample",
    "queue",
    "step",
    "model",
    "kernel",
    "tensor",
    "layer",
    "attention",
    "page",
    "table",
    "prefix",
    "hash",
    "scheduler",
    "latency",
    "throughput",
    "client",
]


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def make_prompts(n: int, input_words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(input_words)) for i in range(n)]


async def one_request(
    client: openai.AsyncOpenAI, model: str, prompt: str, output_len: int, ignore_eos: bool
) -> RequestResult:
    start = time.perf_counter()
    result = RequestResult(ok=False)
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=output_len,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True} if ignore_eos else None,
        )
        async for chunk in stream:
            now = time.perf_counter() - start
            if chunk.choices and chunk.choices[0].text:
                if not result.chunk_times:
                    result.ttft = now
                result.chunk_times.append(now)
            if chunk.usage is not None:
                result.output_tokens = chunk.usage.completion_tokens or 0
        result.e2e = time.perf_counter() - start
        result.ok = bool(result.chunk_times)
    except Exception as exc:  # a failed request is counted, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_rate(
    base_url: str,
    model: str,
    prompts: list[str],
    output_len: int,
    rate: float,
    seed: int,
    ignore_eos: bool = True,
) -> tuple[list[RequestResult], float]:
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    tasks = []
    t0 = time.perf_counter()
    try:
        for prompt in prompts:
            tasks.append(
                asyncio.create_task(one_request(client, model, prompt, output_len, ignore_eos))
            )
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    finally:
        await client.close()
    return list(results), time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(
    rate: float, results: list[RequestResult], duration: float, slo_ttft: float, slo_tpot: float
) -> dict[str, float]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    itls = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    good = [r for r in ok if r.ttft <= slo_ttft and (r.tpot or 0.0) <= slo_tpot]
    return {
        "rate": rate,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "req_per_s": len(ok) / duration,
        "out_tok_per_s": sum(r.output_tokens for r in ok) / duration,
        "goodput_req_per_s": len(good) / duration,
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p99_ms": 1000 * percentile(ttfts, 99),
        "tpot_p50_ms": 1000 * percentile(tpots, 50),
        "tpot_p99_ms": 1000 * percentile(tpots, 99),
        "itl_p50_ms": 1000 * percentile(itls, 50),
        "itl_p99_ms": 1000 * percentile(itls, 99),
        "mean_tpot_ms": 1000 * statistics.fmean(tpots) if tpots else float("nan"),
    }


def render(rows: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| system | rate (req/s) | done | failed | req/s | out tok/s | goodput req/s "
        "| TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        rate = "inf" if r["rate"] == float("inf") else f"{r['rate']:g}"
        lines.append(
            f"| {r['system']} | {rate} | {r['completed']:.0f} | {r['failed']:.0f} "
            f"| {r['req_per_s']:.2f} | {r['out_tok_per_s']:.1f} | {r['goodput_req_per_s']:.2f} "
            f"| {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
            f"| {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} "
            f"| {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def launched_server(cmd: list[str], threads: int | None, log_path: str):
    """Run ``cmd`` (a server taking ``--port``) on a free port until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    if threads:
        # On a shared CPU, OpenMP workers spinning for a core slow a small model's steps by
        # orders of magnitude (docs/performance.md); one thread per process is the fair setting.
        env["OMP_NUM_THREADS"] = str(threads)
    log = open(log_path, "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("the server did not become healthy in 600 s")
        yield f"{base}/v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def export_default_model(path: Path) -> Path:
    """The course's default model (a GGUF file) as a Hugging Face directory, made once.

    ``transformers serve`` takes a checkpoint directory or a hub id; the GGUF's weights are
    dequantized by transformers on load, copied into a plain ``LlamaForCausalLM`` (a model loaded
    from GGUF refuses ``save_pretrained``) and saved with the tokenizer and chat template.
    """
    if (path / "config.json").is_file():
        return path
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from mini_vllm.model.loader import load_tokenizer, resolve_model

    source = resolve_model(None)
    loaded = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    skip = ("quantization_config", "_name_or_path")
    config = LlamaConfig(**{k: v for k, v in loaded.config.to_dict().items() if k not in skip})
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(path)
    load_tokenizer(source).save_pretrained(path)
    return path


def write_random_model(shape: str, path: Path, tokenizer_dir: str | None = None) -> Path:
    """A random-weight checkpoint of one of ``bench_engine``'s shapes, with SmolLM2's tokenizer.

    The vocabulary is the tokenizer's (49,152), not the imitated model's: every sampled id must
    decode, or the streamed text (what TTFT and ITL are measured on) would be empty.
    """
    from engine_workload import save_random_llama
    from transformers import AutoTokenizer

    from mini_vllm.model.loader import load_tokenizer, resolve_model

    if (path / "config.json").is_file():
        return path
    if tokenizer_dir is not None:  # e.g. on a GPU host without the course's model package
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        tokenizer = load_tokenizer(resolve_model(None))
    save_random_llama(
        shape,
        path,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    tokenizer.save_pretrained(path)
    return path


def bench_system(
    system: str,
    base_url: str,
    model: str,
    prompts: list[str],
    rates: list[float],
    args: argparse.Namespace,
) -> list[dict]:
    # One short request first: the first step pays one-time costs that are not serving.
    asyncio.run(run_rate(base_url, model, prompts[:1], 4, float("inf"), 0, args.ignore_eos))
    rows = []
    for i, rate in enumerate(rates):
        results, duration = asyncio.run(
            run_rate(
                base_url, model, prompts, args.output_len, rate, args.seed + i, args.ignore_eos
            )
        )
        row = summarize(rate, results, duration, args.slo_ttft, args.slo_tpot)
        row["system"] = system
        rows.append(row)
        errors = [r.error for r in results if not r.ok]
        if errors:
            print(f"{system} rate {rate}: {len(errors)} failed, e.g. {errors[0]}", file=sys.stderr)
        print(render(rows[-1:], f"{system}, rate {rate}"), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=None, help="an existing server's .../v1")
    parser.add_argument("--model", default=None, help="start `mini_vllm serve` with this model")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument(
        "--random-model",
        default=None,
        help="serve random weights of one of bench_engine.py's shapes (smollm2-135m, llama-1b, "
        "llama-8b) with SmolLM2's tokenizer, written once under build/",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="a saved tokenizer directory for --random-model"
    )
    parser.add_argument(
        "--transformers-model",
        default=None,
        help="also run `transformers serve --continuous-batching` on this Hugging Face "
        "checkpoint directory (`default`: the course's SmolLM2, exported to build/; `same`: the "
        "--random-model checkpoint), in the same run (implies --no-ignore-eos: it refuses the "
        "field)",
    )
    parser.add_argument("--rates", nargs="+", default=["1", "4", "inf"])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-words", type=int, default=48, help="words per prompt")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (output lengths then vary)",
    )
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="seconds, for goodput")
    parser.add_argument("--slo-tpot", type=float, default=0.2, help="seconds, for goodput")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS of the launched servers"
    )
    parser.add_argument("--out", default=None, help="write the Markdown table here")
    parser.add_argument("--server-log", default="build/bench_serving_server.log")
    parser.add_argument(
        "--server-args", nargs=argparse.REMAINDER, default=[], help="passed to `serve`"
    )
    args = parser.parse_args(argv)
    # A SIGTERM (e.g. from `timeout`) must unwind the `with` blocks that stop the servers: they
    # run in their own sessions, and an orphaned GPU server keeps its memory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.random_model:
        path = Path(f"build/serving-random-{args.random_model}")
        args.model = str(write_random_model(args.random_model, path, args.tokenizer))
        if args.transformers_model == "same":
            args.transformers_model = args.model
    if args.transformers_model:
        args.ignore_eos = False
        if args.transformers_model == "default":
            args.transformers_model = str(export_default_model(Path("build/smollm2-135m-hf")))
    rates = [float(r) for r in args.rates]
    prompts = make_prompts(args.num_prompts, args.input_words, args.seed)
    Path(args.server_log).parent.mkdir(parents=True, exist_ok=True)

    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            cmd = [sys.executable, "-m", "mini_vllm", "serve"]
            cmd += ["--model", args.model] if args.model else []
            cmd += args.server_args
            base_url = stack.enter_context(launched_server(cmd, args.threads, args.server_log))
        model = args.served_model_name
        if model is None:
            model = openai.OpenAI(base_url=base_url, api_key="unused").models.list().data[0].id
        rows += bench_system("mini-vLLM", base_url, model, prompts, rates, args)
    if args.transformers_model:
        cli = os.path.join(os.path.dirname(sys.executable), "transformers")
        cmd = [cli, "serve", args.transformers_model, "--continuous-batching"]
        cmd += ["--host", "127.0.0.1", "--dtype", _transformers_dtype()]
        log = args.server_log.replace(".log", "_transformers.log")
        try:
            with launched_server(cmd, args.threads, log) as hf_url:
                rows += bench_system(
                    "transformers serve", hf_url, args.transformers_model, prompts, rates, args
                )
        except Exception as exc:  # keep mini-vLLM's rows; say why the comparison is missing
            print(f"transformers serve did not run ({exc}); see {log}", file=sys.stderr)

    eos = "ignore_eos" if args.ignore_eos else "stopping at EOS"
    header = (
        f"{args.num_prompts} prompts of {args.input_words} words, at most {args.output_len} "
        f"output tokens each ({eos}), streaming; SLO for goodput: TTFT <= {args.slo_ttft} s, "
        f"TPOT <= {args.slo_tpot} s; model `{model}`."
    )
    table = render(rows, header)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table, encoding="utf-8")
    return 0


def _transformers_dtype() -> str:
    """The dtype mini-vLLM's ``auto`` picks: bfloat16 on a GPU, float32 on a CPU."""
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


if __name__ == "__main__":
    sys.exit(main())
