"""lab-09, part 2: the whole engine, running on your ``prepare_inputs``, generates exactly what
Hugging Face ``generate`` does.

The engine is mini-vLLM's reference (scheduler, KV cache manager, model, attention, sampler);
only the input preparation is yours, swapped in by the ``your_prepare_inputs`` fixture. Each
configuration changes *how* the engine reaches the tokens (prefix-cache hits skip work, a small
token budget chunks prompts over several steps, a tiny KV cache forces preemption and
recomputation, an odd block size moves block boundaries), never *which* tokens: greedy output
must equal Hugging Face's token for token. A wrong position rotates the keys wrongly (RoPE), a
wrong slot writes a token's K/V over someone else's, a wrong ``seq_len`` hides context: each
one changes the tokens sooner or later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grading.suite import graded

from .conftest import MAX_NEW, PROMPTS

DOC = "phases/05-end-to-end/README.md"


def generate(path: Path, **kwargs: Any) -> tuple[list[list[int]], Any]:
    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], llm


def assert_parity(got: list[list[int]], expected: list[list[int]], setting: str) -> None:
    for i, (ours, theirs) in enumerate(zip(got, expected)):
        if ours != theirs:
            first = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                         min(len(ours), len(theirs)))
            raise AssertionError(
                f"{setting}: prompt {i} ({len(PROMPTS[i])} tokens) diverges from Hugging Face at "
                f"output token {first}: ours {ours[:first + 3]}..., "
                f"Hugging Face {theirs[:first + 3]}...")


@graded(6, "parity: with your prepare_inputs the engine must reproduce Hugging Face's greedy "
           "tokens; the first wrong token usually points at positions (RoPE) or slot_mapping",
        f"{DOC}#parity-with-hugging-face")
def test_greedy_parity_default_engine(tiny_checkpoint: Path, hf_greedy: list[list[int]],
                                      your_prepare_inputs: list[int]):
    """Eight prompts batched together, prefix caching on (three share a 37-token prefix)."""
    got, llm = generate(tiny_checkpoint)
    assert your_prepare_inputs[0] > 0, "the engine did not call your prepare_inputs"
    assert_parity(got, hf_greedy, "default engine")
    assert llm.get_stats().prefix_cache_hits > 0, "the shared prefix should have been hit"


@graded(4, "parity under chunked prefill: a prompt split over several steps continues at "
           "position num_computed_tokens, in the blocks its table already holds",
        f"{DOC}#parity-with-hugging-face")
def test_greedy_parity_chunked_prefill(tiny_checkpoint: Path, hf_greedy: list[list[int]],
                                       your_prepare_inputs: list[int]):
    """A 16-token step budget: long prompts take several steps, mixed with decodes."""
    got, _ = generate(tiny_checkpoint, max_num_batched_tokens=16, max_num_seqs=4)
    assert your_prepare_inputs[0] > 0, "the engine did not call your prepare_inputs"
    assert_parity(got, hf_greedy, "chunked prefill, 16 tokens per step")


@graded(4, "parity on a second batch: prefix-cache hits are skipped, so input_ids, positions "
           "and slots must start at num_computed_tokens, not at 0",
        f"{DOC}#parity-with-hugging-face")
def test_greedy_parity_with_prefix_cache_hits(tiny_checkpoint: Path, hf_greedy: list[list[int]],
                                              your_prepare_inputs: list[int]):
    """The same prompts twice on one engine: the second time every full block is a hit."""
    from mini_vllm.sampling_params import SamplingParams

    _, llm = generate(tiny_checkpoint)
    hits = llm.get_stats().prefix_cache_hits
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert llm.get_stats().prefix_cache_hits > hits, "the second batch should hit the cache"
    assert any((o.num_cached_tokens or 0) > 0 for o in again)
    assert_parity([o.outputs[0].token_ids for o in again], hf_greedy, "second batch (cache hits)")


@graded(3, "parity with an odd block size and a tiny KV cache: block boundaries move and "
           "preempted requests are recomputed from scratch into new blocks",
        f"{DOC}#parity-with-hugging-face")
def test_greedy_parity_block_size_5_with_preemption(tiny_checkpoint: Path,
                                                    hf_greedy: list[list[int]],
                                                    your_prepare_inputs: list[int]):
    """Blocks of 5 tokens; 13 blocks for 8 requests that want ~60: preemption is certain."""
    from mini_vllm.worker import kv_sizing

    # 2 layers, 2 KV heads of 16 dims, float32
    block = kv_sizing.bytes_per_block(5, 2, 2, 16, 4)
    got, llm = generate(tiny_checkpoint, block_size=5, max_model_len=60,
                        kv_cache_memory_bytes=13 * block)
    assert_parity(got, hf_greedy, "block_size 5, 13-block cache")
    assert llm.get_stats().num_preemptions > 0, "the tiny cache should have forced preemption"
