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

from typing import Any

from grading.remote import LearnerError
from grading.suite import graded, learner_module
from tests.labs.lab_09.support import runner

from .conftest import MAX_NEW, PROMPTS, hf_greedy

DOC = "phases/05-end-to-end/README.md"


def generate(batches: int = 1, **options: Any) -> dict[str, Any]:
    """The engine's greedy tokens for PROMPTS, run in the learner process on your
    ``prepare_inputs`` (``learner_side.run_engine``), as plain data, after checking its shape."""
    mod = runner("prepare_inputs")  # a stub, or a broken import, is reported as such
    try:  # one token, to tell a stub helper (NOT STARTED) before the learner loads a model
        mod.prepare_inputs([[1]], [0], [1], [[1]], 16)
    except NotImplementedError:
        raise
    except LearnerError:
        pass  # the engine's own steps decide
    got = learner_module("learner_side").run_engine(PROMPTS, MAX_NEW, options, batches)
    assert isinstance(got, dict) and isinstance(got.get("tokens"), list), (
        "the engine run did not report its tokens"
    )
    for batch in got["tokens"]:
        assert (
            isinstance(batch, list)
            and len(batch) == len(PROMPTS)
            and all(isinstance(ids, list) and all(type(t) is int for t in ids) for ids in batch)
        ), f"the engine should return {len(PROMPTS)} lists of token ids per batch"
    assert len(got["tokens"]) == batches, (
        f"the engine ran {len(got['tokens'])} of {batches} batches"
    )
    for key in ("calls", "preemptions"):
        assert type(got.get(key)) is int, f"the engine run did not report {key}"
    assert got["calls"] > 0, "the engine did not call your prepare_inputs"
    return got


def assert_parity(got: list[list[int]], expected: list[list[int]], setting: str) -> None:
    for i, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        if ours != theirs:
            first = next(
                (k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)),
            )
            raise AssertionError(
                f"{setting}: prompt {i} ({len(PROMPTS[i])} tokens) diverges from Hugging Face at "
                f"output token {first}: ours {ours[: first + 3]}..., "
                f"Hugging Face {theirs[: first + 3]}..."
            )


@graded(
    6,
    "parity: with your prepare_inputs the engine must reproduce Hugging Face's greedy "
    "tokens; the first wrong token usually points at positions (RoPE) or slot_mapping",
    f"{DOC}#parity-with-hugging-face",
)
def test_greedy_parity_default_engine():
    """Eight prompts batched together, prefix caching on (three share a 37-token prefix)."""
    got = generate()
    assert_parity(got["tokens"][0], hf_greedy(), "default engine")
    assert got["hits"][0] > 0, "the shared prefix should have been hit"


@graded(
    4,
    "parity under chunked prefill: a prompt split over several steps continues at "
    "position num_computed_tokens, in the blocks its table already holds",
    f"{DOC}#parity-with-hugging-face",
)
def test_greedy_parity_chunked_prefill():
    """A 16-token step budget: long prompts take several steps, mixed with decodes."""
    got = generate(max_num_batched_tokens=16, max_num_seqs=4)
    assert_parity(got["tokens"][0], hf_greedy(), "chunked prefill, 16 tokens per step")


@graded(
    4,
    "parity on a second batch: prefix-cache hits are skipped, so input_ids, positions "
    "and slots must start at num_computed_tokens, not at 0",
    f"{DOC}#parity-with-hugging-face",
)
def test_greedy_parity_with_prefix_cache_hits():
    """The same prompts twice on one engine: the second time every full block is a hit."""
    got = generate(batches=2)
    assert got["hits"][1] > got["hits"][0], "the second batch should hit the cache"
    assert any(n > 0 for n in got["cached"][1]), (
        "no request of the second batch found cached tokens"
    )
    assert_parity(got["tokens"][1], hf_greedy(), "second batch (cache hits)")


@graded(
    3,
    "parity with an odd block size and a tiny KV cache: block boundaries move and "
    "preempted requests are recomputed from scratch into new blocks",
    f"{DOC}#parity-with-hugging-face",
)
def test_greedy_parity_block_size_5_with_preemption():
    """Blocks of 5 tokens; 13 blocks for 8 requests that want ~60: preemption is certain."""
    from mini_vllm.worker import kv_sizing

    # 2 layers, 2 KV heads of 16 dims, float32
    block = kv_sizing.bytes_per_block(5, 2, 2, 16, 4)
    got = generate(block_size=5, max_model_len=60, kv_cache_memory_bytes=13 * block)
    assert_parity(got["tokens"][0], hf_greedy(), "block_size 5, 13-block cache")
    assert got["preemptions"] > 0, "the tiny cache should have forced preemption"
