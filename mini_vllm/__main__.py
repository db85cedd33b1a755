"""Command line: ``python -m mini_vllm generate "What is the capital of France?" --max-tokens 32``.

Prints the completion, the KV cache blocks held at peak and the prefix-cache hit rate. A model
with a chat template gets the prompt as one user message in it (``--no-chat``: the raw text).
``python -m mini_vllm serve [MODEL]`` starts the OpenAI-compatible server (phase 06).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mini_vllm.entrypoints.openai.cli_args import add_serve_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini_vllm", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a completion for one or more prompts")
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--model", default=None, help="checkpoint directory or .gguf file")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    gen.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        help="apply the model's chat template (default: when the model has one)",
    )
    gen.add_argument("--block-size", type=int, default=16)
    gen.add_argument("--max-model-len", type=int, default=None)
    gen.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--enforce-eager", action="store_true")
    gen.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1,
        help="split the model over N worker processes (gloo on CPU, NCCL on GPUs)",
    )  # fmt: skip
    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (needs the `serve` extra)"
    )
    add_serve_args(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            from mini_vllm.entrypoints.openai.api_server import run_server
        except ImportError as exc:
            print(f"serve needs the server dependencies ({exc}): pip install -e '.[serve]'")
            return 1
        return run_server(args)
    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        device=args.device,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )
    use_chat = args.chat
    if use_chat is None:  # an instruction-tuned model answers only inside its chat template
        use_chat = getattr(llm.get_tokenizer(), "chat_template", None) is not None
    if use_chat:
        conversations = [[{"role": "user", "content": p}] for p in args.prompts]
        outputs = llm.chat(conversations, params, use_tqdm=False)
    else:
        outputs = llm.generate(list(args.prompts), params, use_tqdm=False)
    for prompt, output in zip(args.prompts, outputs):
        completion = output.outputs[0]
        print(f"prompt: {prompt!r}")
        print(f"answer: {completion.text.strip()!r}")
        reason = completion.finish_reason
        print(f"        {len(completion.token_ids)} tokens, finish_reason={reason}")
    stats = llm.get_stats()
    print(
        f"KV blocks used: {stats.kv_blocks_used_peak} peak of {stats.num_gpu_blocks} "
        f"({stats.block_size} tokens each)"
    )
    print(
        f"prefix cache hit rate: {stats.prefix_cache_hit_rate:.1%} "
        f"({stats.prefix_cache_hits}/{stats.prefix_cache_queries} prompt tokens)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
