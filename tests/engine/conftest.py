"""Fixtures of the engine tests: tiny random Llama checkpoints, written once per session.

The checkpoints are saved by transformers itself (``save_pretrained``), so the engine loads them
through exactly the path it uses for real models. Two shapes cover what the Llama family varies:
``tiny_llama`` (tied embeddings, plain RoPE, GQA 4/2) and ``tiny_llama3`` (untied, llama3 RoPE
scaling, an explicit ``head_dim`` unequal to ``hidden/heads``, projection biases).

Weights are drawn with a large ``initializer_range`` so that logits are spread out: greedy parity
with Hugging Face is then decided by the model, not by float noise between near-tied logits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY_VOCAB = 128

# The models here are small enough that intra-op threads cost more in synchronisation than
# they gain, and on a loaded machine spinning OpenMP workers slow every small op by 10-50x.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _free_gpu_engines() -> Any:
    """On a GPU, release each test's engine before the next one sizes its KV cache.

    An engine takes ``gpu_memory_utilization`` of the whole device for its cache, and engines
    hold reference cycles, so without a collection the next test's engine would find the
    memory still taken and fail to start.
    """
    yield
    if torch.cuda.is_available():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def _save_tiny(path: Path, seed: int, **overrides: Any) -> Path:
    config_kwargs: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config_kwargs.update(overrides)
    config = transformers.LlamaConfig(**config_kwargs)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny_llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(
        tmp_path_factory.mktemp("tiny_llama3"),
        seed=1,
        tie_word_embeddings=False,
        head_dim=24,
        attention_bias=True,
        rope_theta=50000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )


def load_hf(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.float().eval()


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama_dir: Path) -> Any:
    return load_hf(tiny_llama_dir)


@pytest.fixture(scope="session")
def hf_tiny_llama3(tiny_llama3_dir: Path) -> Any:
    return load_hf(tiny_llama3_dir)


def hf_greedy(hf_model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face's own greedy continuation of one prompt (no padding, no EOS)."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def random_prompts(n: int, seed: int, min_len: int = 3, max_len: int = 40) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(0, TINY_VOCAB, (k,), generator=gen).tolist() for k in lengths]
