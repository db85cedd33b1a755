"""``python -m mini_vllm``: ``serve``'s options, and ``generate`` applying the chat template."""

from __future__ import annotations

import pytest

from mini_vllm.__main__ import build_parser, main

from .conftest import TINY_KV_BYTES, TINY_MAX_MODEL_LEN


def test_serve_options_parse():
    args = build_parser().parse_args(
        ["serve", "--port", "9000", "--max-model-len", "512", "--no-enable-prefix-caching"]
    )
    assert (args.command, args.host, args.port, args.max_model_len) == (
        "serve",
        "127.0.0.1",
        9000,
        512,
    )
    assert args.enable_prefix_caching is False and args.model is None


def test_serve_takes_upstreams_command_line():
    """``vllm serve MODEL`` with upstream's on/off flags and policy maps onto EngineArgs."""
    from mini_vllm.entrypoints.openai.cli_args import engine_args_from_cli

    parse = build_parser().parse_args
    defaults = engine_args_from_cli(parse(["serve"]))
    assert (defaults.enable_prefix_caching, defaults.enable_chunked_prefill) == (True, True)
    assert (defaults.async_scheduling, defaults.scheduling_policy) == (True, "fcfs")
    flags = ["--no-enable-chunked-prefill", "--no-async-scheduling", "--enable-prefix-caching"]
    args = engine_args_from_cli(
        parse(["serve", "/models/x", *flags, "--scheduling-policy", "priority"])
    )
    assert args.model == "/models/x", "the positional model is `vllm serve MODEL`'s"
    assert (args.enable_chunked_prefill, args.async_scheduling) == (False, False)
    assert (args.enable_prefix_caching, args.scheduling_policy) == (True, "priority")
    assert engine_args_from_cli(parse(["serve", "a", "--model", "b"])).model == "a"
    memory = ["--num-gpu-blocks-override", "40", "--long-prefill-token-threshold", "64"]
    args = engine_args_from_cli(parse(["serve", *memory]))
    assert (args.num_gpu_blocks_override, args.long_prefill_token_threshold) == (40, 64)
    assert (defaults.num_gpu_blocks_override, defaults.long_prefill_token_threshold) == (None, 0)
    with pytest.raises(SystemExit):
        parse(["serve", "--scheduling-policy", "lifo"])


def test_generate_chat_flag_defaults_to_auto():
    parse = build_parser().parse_args
    assert parse(["generate", "hi"]).chat is None  # auto: the template if the model has one
    assert parse(["generate", "hi", "--chat"]).chat is True
    assert parse(["generate", "hi", "--no-chat"]).chat is False


@pytest.mark.parametrize("flag", [[], ["--no-chat"]])
def test_generate_uses_the_chat_template_unless_told_not_to(
    tiny_serve_dir, flag, capsys, monkeypatch
):
    from mini_vllm.llm import LLM

    calls = []
    monkeypatch.setattr(LLM, "chat", lambda self, *a, **k: calls.append("chat") or [])
    monkeypatch.setattr(LLM, "generate", lambda self, *a, **k: calls.append("generate") or [])
    common = ["--max-model-len", str(TINY_MAX_MODEL_LEN)]
    common += ["--kv-cache-memory-bytes", str(TINY_KV_BYTES), "--max-tokens", "4"]
    assert main(["generate", "Hello", "--model", str(tiny_serve_dir), *common, *flag]) == 0
    assert calls == (["generate"] if flag else ["chat"])
