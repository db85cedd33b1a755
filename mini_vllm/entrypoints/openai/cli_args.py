"""``serve``'s command-line options (upstream: ``vllm/entrypoints/openai/cli_args.py``).

Kept apart from the server so that ``python -m mini_vllm --help`` and ``generate`` build their
parser without importing FastAPI, uvicorn or torch.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_vllm.engine.llm_engine import EngineArgs

DEFAULT_SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``serve``'s options: the server's, then the engine's, under upstream's flag names (a
    ``vllm serve`` command line that uses only these runs unchanged)."""
    parser.add_argument(
        "model_tag", nargs="?", default=None, help="the model, as `vllm serve MODEL` takes it"
    )
    parser.add_argument("--model", default=None, help="checkpoint directory or .gguf file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-model-name",
        default=None,
        help=f"the name clients pass as `model` (default: MODEL, or {DEFAULT_SERVED_MODEL_NAME})",
    )
    parser.add_argument(
        "--api-key", nargs="+", default=None,
        help="require `Authorization: Bearer KEY` (one of these) on /v1 routes; "
        "default: $VLLM_API_KEY",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument(
        "--enable-prompt-tokens-details", action="store_true",
        help="report each response's prefix-cache hits as usage.prompt_tokens_details",
    )  # fmt: skip
    parser.add_argument(
        "--chat-template", default=None,
        help="the chat template (a file, or the template itself) instead of the tokenizer's",
    )  # fmt: skip
    parser.add_argument(
        "--default-chat-template-kwargs", type=json.loads, default=None,
        help="the chat template's variables, as JSON, under each request's chat_template_kwargs",
    )  # fmt: skip
    parser.add_argument(
        "--trust-request-chat-template", action="store_true",
        help="render a request's own chat_template (refused otherwise: a template runs code "
        "in the server's Jinja sandbox)",
    )  # fmt: skip
    engine = parser.add_argument_group("engine")
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    engine.add_argument(
        "--num-gpu-blocks-override", type=int, default=None,
        help="use this many KV blocks whatever the memory allows (to watch preemption)",
    )  # fmt: skip
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    on_off = argparse.BooleanOptionalAction
    engine.add_argument("--enable-prefix-caching", action=on_off, default=True)
    engine.add_argument("--enable-chunked-prefill", action=on_off, default=True)
    engine.add_argument(
        "--long-prefill-token-threshold", type=int, default=0,
        help="a prompt chunk of a long prompt holds at most this many tokens (0: no limit)",
    )  # fmt: skip
    engine.add_argument(
        "--async-scheduling", action=on_off, default=True,
        help="plan step N+1 while step N runs (upstream's default at the pin)",
    )  # fmt: skip
    engine.add_argument(
        "--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
        help="priority: a request's `priority` field orders admission (smaller first)",
    )  # fmt: skip
    engine.add_argument("--device", default="auto")
    engine.add_argument("--dtype", default="auto")
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1,
        help="split the model over N worker processes (gloo on CPU, NCCL on GPUs)",
    )  # fmt: skip
    engine.add_argument(
        "--max-logprobs", type=int, default=20,
        help="most logprobs a request may ask for (-1: the whole vocabulary)",
    )  # fmt: skip
    return parser


def engine_args_from_cli(args: argparse.Namespace) -> EngineArgs:
    from mini_vllm.engine.llm_engine import EngineArgs

    return EngineArgs(
        model=args.model_tag or args.model,  # the positional one wins, as upstream's
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        async_scheduling=args.async_scheduling,
        scheduling_policy=args.scheduling_policy,
        device=args.device,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        max_logprobs=args.max_logprobs,
    )
