"""What the engine benchmark serves: the requests, their arrival times, and the model.

The requests follow nano-vllm's benchmark: random token ids, input and output lengths uniform
in a range, one seed, so every system of a run (and every run of a scale) gets the same list.
``SCALES`` names the sizes; ``RANDOM_MODELS`` the published shapes a random-weight model can
take (the tensor-parallel runs use ``llama-8b``). :func:`stage_prepare` writes the checkpoint
every system then loads, so no system pays for a conversion the others do not.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from engine_measure import torch_setup

SCALES: dict[str, dict[str, int]] = {
    "nano": dict(num_requests=256, min_input=100, max_input=1024, min_output=100, max_output=1024),
    "cpu": dict(num_requests=16, min_input=16, max_input=64, min_output=16, max_output=64),
    "smoke": dict(num_requests=6, min_input=4, max_input=24, min_output=4, max_output=12),
}

# Shapes of the random-weight models (the published configs of the models they imitate).
RANDOM_MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama-1b": dict(  # Llama-3.2-1B
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama-8b": dict(  # Llama-3.1-8B: the 8B-class shape of the tensor-parallel runs
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}


def make_workload(
    num_requests: int,
    min_input: int,
    max_input: int,
    min_output: int,
    max_output: int,
    seed: int,
    vocab_size: int,
) -> list[dict[str, Any]]:
    """nano-vllm's benchmark: random token ids, input and output lengths uniform, one seed."""
    rng = random.Random(seed)
    top = min(vocab_size, 10_000)
    prompts = [
        [rng.randrange(top) for _ in range(rng.randint(min_input, max_input))]
        for _ in range(num_requests)
    ]
    outputs = [rng.randint(min_output, max_output) for _ in range(num_requests)]
    return [{"prompt": p, "output_len": n} for p, n in zip(prompts, outputs)]


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def save_random_llama(shape: str, path: Path, **overrides: Any) -> Any:
    """Random weights of one of ``RANDOM_MODELS``' shapes (seed 0), saved to ``path``.

    Drawn on the GPU when there is one and saved in bfloat16 there, float32 on a CPU: the dtype
    the engine runs by default on each. ``overrides`` replace config fields (vocabulary, special
    tokens). Returns the model, for its parameter count.
    """
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**RANDOM_MODELS[shape], **overrides})
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model.to(torch.bfloat16 if device == "cuda" else torch.float32).save_pretrained(path)
    return model


def stage_prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Write the checkpoint every other stage loads: random weights, or a GGUF as safetensors."""
    torch_setup("cpu", args.threads)  # thread count for the stage's torch work
    import transformers

    out = Path(args.model_dir)
    if args.random_model:
        model = save_random_llama(
            args.random_model, out, bos_token_id=None, eos_token_id=None, pad_token_id=None
        )
        source = f"random weights, {args.random_model} shape"
    else:
        from mini_vllm.model.loader import convert_gguf, resolve_model

        src = resolve_model(args.model)  # a GGUF file: its folder in the checkpoint cache
        if src.gguf_file is not None:  # the cache is off: convert here, as the cache would
            convert_gguf(src, out)
            model = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                src.path, **src.from_pretrained_kwargs()
            )
            model.save_pretrained(out)
        source = f"{src} (float32)" if src.gguf_file or src.converted_from else str(src)
    params = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    return {"source": source, "params": params, "vocab_size": model.config.vocab_size}


def fill_decode_batch(
    engine: Any, batch: int, context: int, seed: int = 0, params: Any = None
) -> None:
    """Add ``batch`` requests of ``context`` random prompt tokens (endless; greedy unless
    ``params`` say otherwise) and step the engine until every one has its first output token:
    from then on each step is a decode of the whole batch, the steady state the step profilers
    time."""
    import torch

    from mini_vllm.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    if params is None:
        params = SamplingParams(temperature=0.0, max_tokens=10**6, ignore_eos=True)
    vocab = engine.hf_config.vocab_size
    for i in range(batch):
        prompt = torch.randint(vocab, (context,), generator=gen).tolist()
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    sched = engine.scheduler
    while sched.waiting or any(r.num_output_tokens == 0 for r in sched.running):
        engine.step()
