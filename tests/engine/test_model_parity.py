"""Our Llama against Hugging Face's, logit for logit, in float32 on CPU (and on a GPU).

Two paths are checked: the dense path (no cache, used by the memory-profiling run) and the paged
path the engine uses, where sequences arrive in chunks of a flattened batch, prefill chunks and
decodes mixed, their K/V scattered over non-contiguous blocks. Every token's logits must match
Hugging Face's full-sequence forward at the same position to 1e-4 (2e-4 on a GPU, below).

With a CUDA device the same checks also run with our model on it (Hugging Face's stays on the
CPU): the fused Triton layer kernels then replace the torch layers, and the paged path runs both
through the torch attention and through the Triton attention kernels.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mini_vllm.model.attention import AttentionMetadata
from mini_vllm.model.layers import default_inv_freq, llama3_inv_freq, rope_parameters
from mini_vllm.model.loader import get_model, resolve_model
from mini_vllm.worker.model_inputs import prepare_inputs

from .conftest import ON_CUDA

ATOL = 1e-4
# On a GPU our float32 sums in other orders than Hugging Face's on the CPU (cuBLAS tiles, the
# fused Triton kernels). Float32 rounding alone moves these logits by up to 1.5e-5 (measured
# against float64), so two float32 computations may differ by twice that; a real error (a wrong
# position, mask or head) moves them by 1e-2 and more.
ATOL_CUDA = 2e-4

# (model, device): ids stay the model's name on the CPU, as they always were.
VARIANTS = [pytest.param((name, "cpu"), id=name) for name in ("tiny_llama", "tiny_llama3")]
if ON_CUDA:
    VARIANTS += [
        pytest.param((name, "cuda"), id=f"{name}-cuda") for name in ("tiny_llama", "tiny_llama3")
    ]


@pytest.fixture(scope="module", params=VARIANTS)
def model_pair(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    name, device = request.param
    path = request.getfixturevalue(f"{name}_dir")
    hf = request.getfixturevalue(f"hf_{name}")
    ours, _ = get_model(resolve_model(str(path)), torch.device(device), torch.float32)
    return ours, hf


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def test_dense_forward_matches_hf(model_pair: tuple[Any, Any]) -> None:
    ours, hf = model_pair
    device = _device(ours)
    ids = torch.randint(
        0, hf.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ref = hf(ids).logits[0]
        got = ours.compute_logits(ours(ids[0].to(device), torch.arange(200, device=device)))
    atol = ATOL_CUDA if device.type == "cuda" else ATOL
    torch.testing.assert_close(got.cpu(), ref, atol=atol, rtol=0)


def test_paged_chunked_mixed_batches_match_hf(model_pair: tuple[Any, Any]) -> None:
    """Three sequences through three steps: chunks, whole prompts and decodes in one batch.

    On a GPU twice, through the torch attention and through the Triton kernels (on a CPU those
    run only in Triton's interpreter, which the engine-level test_generate_tiny.py covers).
    """
    ours, hf = model_pair
    device = _device(ours)
    for use_triton in [False, True] if device.type == "cuda" else [False]:
        _run_paged_steps(ours, hf, device, use_triton)


def _run_paged_steps(ours: Any, hf: Any, device: torch.device, use_triton: bool) -> None:
    block_size = 4
    gen = torch.Generator().manual_seed(1)
    seqs = [
        torch.randint(0, hf.config.vocab_size, (n,), generator=gen).tolist() for n in (39, 6, 21)
    ]
    with torch.no_grad():
        refs = [hf(torch.tensor([s])).logits[0] for s in seqs]

    num_blocks = 40
    # Blocks handed out in a scrambled order, block 0 kept free as upstream's null block.
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = [perm[0:10], perm[10:12], perm[12:18]]
    kv_cache = torch.zeros(
        ours.num_layers, 2, num_blocks, block_size, ours.num_kv_heads, ours.head_dim, device=device
    )
    kv_caches = list(kv_cache.unbind(0))

    # (sequence, tokens already computed, tokens scheduled) per step
    steps = [
        [(0, 0, 16), (1, 0, 5), (2, 0, 20)],  # a chunk, two whole prompts
        [(1, 5, 1), (0, 16, 22), (2, 20, 1)],  # decode, the rest of a prompt, decode
        [(0, 38, 1)],  # decode alone
    ]
    for step in steps:
        idx = [s for s, _, _ in step]
        inputs = prepare_inputs(
            [seqs[i] for i in idx],
            [c for _, c, _ in step],
            [n for _, _, n in step],
            [tables[i] for i in idx],
            block_size,
        )
        metadata = AttentionMetadata(
            slot_mapping=inputs.slot_mapping.to(device),
            block_tables=inputs.block_tables.to(device),
            query_start_loc=inputs.query_start_loc.to(device),
            seq_lens=inputs.seq_lens.to(device),
            max_query_len=inputs.max_query_len,
            max_seq_len=inputs.max_seq_len,
            use_triton=use_triton,
        )
        with torch.no_grad():
            logits = ours.compute_logits(
                ours(inputs.input_ids.to(device), inputs.positions.to(device), kv_caches, metadata)
            ).cpu()
        start = 0
        for seq, computed, n in step:
            expected = refs[seq][computed : computed + n]
            torch.testing.assert_close(
                logits[start : start + n],
                expected,
                atol=ATOL_CUDA if device.type == "cuda" else ATOL,
                rtol=0,
                msg=lambda m: f"{'Triton' if use_triton else 'torch'} attention: {m}",
            )
            start += n


def test_tied_and_untied_heads(model_pair: tuple[Any, Any]) -> None:
    ours, hf = model_pair
    tied = bool(hf.config.tie_word_embeddings)
    shares = ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    assert shares == tied
    torch.testing.assert_close(ours.lm_head.weight.cpu(), hf.lm_head.weight, atol=0, rtol=0)


def test_llama3_inv_freq_matches_transformers(hf_tiny_llama3: Any) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_tiny_llama3.config
    theta, scaling = rope_parameters(config)
    assert theta == 50000.0 and scaling is not None and scaling["rope_type"] == "llama3"
    ours = llama3_inv_freq(default_inv_freq(24, theta), scaling)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)
    # The scaling matters: long wavelengths were stretched, short ones kept.
    plain = default_inv_freq(24, theta)
    assert torch.equal(ours[0], plain[0]) and ours[-1] < plain[-1]


def test_rope_parameters_old_and_new_config_styles() -> None:
    from types import SimpleNamespace

    old = SimpleNamespace(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0})
    new = SimpleNamespace(rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})

    assert rope_parameters(old) == (
        500000.0,
        {"type": "linear", "factor": 2.0, "rope_type": "linear"},
    )
    assert rope_parameters(new) == (100000.0, None)
