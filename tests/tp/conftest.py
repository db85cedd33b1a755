"""Fixtures of the tensor-parallel tests: a tiny random Llama whose heads split four ways.

``tiny_tp_dir`` has 8 query heads and 2 KV heads: TP=2 gives each rank one KV head of its own,
TP=4 gives each rank one KV head shared with a neighbour (replication), and both divide the
query heads, the MLP width and the padded vocabulary. Untied head and projection biases, so that
every sharding rule (row-parallel bias added once, untied LM head sliced by vocabulary) is
exercised. Transformers initialises biases to zero, and a zero bias added on every rank is still
zero, so ``tiny_tp_model`` fills each ``*.bias`` with random values: a ``RowParallelLinear`` that
adds its bias on all ranks instead of rank 0 alone then changes every greedy output of the parity
tests. Written once per session with transformers' ``save_pretrained``.

Worker processes are started with ``spawn``: each costs an interpreter and a torch import
(about 2 s on 2 cores), so the tests share engines where they can.
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

torch.set_num_threads(1)

TINY_TP_CONFIG: dict[str, Any] = dict(
    vocab_size=250,  # padded to 256 under TP: the last rank holds 6 rows of padding
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.2,
    tie_word_embeddings=False,
    attention_bias=True,
    mlp_bias=True,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def tiny_tp_config(**overrides: Any) -> Any:
    return transformers.LlamaConfig(**{**TINY_TP_CONFIG, **overrides})


# Biases ~ N(0, 0.1^2) (the weights are N(0, 0.2^2)) from their own generator, seeded so that the
# greedy paths of the parity prompts stay well separated: the smallest gap between the top two
# logits along them is about 0.025 (seed 0 of the bias generator gives 0.008, seed 1 only 0.0004),
# orders of magnitude above what a float32 all-reduce's summation order can move a logit.
BIAS_STD = 0.1
BIAS_SEED = 5


def tiny_tp_model() -> Any:
    """The tiny Llama of these tests, weights seeded, every bias random and non-zero."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_tp_config()).eval()
    gen = torch.Generator().manual_seed(BIAS_SEED)
    with torch.no_grad():
        biases = [p for name, p in model.named_parameters() if name.endswith(".bias")]
        assert biases, "the tiny config must keep attention_bias and mlp_bias"
        for bias in biases:
            bias.copy_(torch.randn(bias.shape, generator=gen) * BIAS_STD)
    return model


@pytest.fixture(scope="session")
def tiny_tp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_tp_llama")
    tiny_tp_model().save_pretrained(path)
    return path


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
