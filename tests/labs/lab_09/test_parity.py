"""lab-09, part 2: the whole engine, running on your ``prepare_inputs``, generates exactly what
Hugging Face ``generate`` does.

The engine is mini-vLLM's reference (scheduler, KV cache manager, model, attention, sampler);
only the input preparation is yours: the engine runs here, in the judge, and calls your
``prepare_inputs`` in the learner process at every step (``generate``). Each
configuration changes *how* the engine reaches the tokens (prefix-cache hits skip work, a small
token budget chunks prompts over several steps, a tiny KV cache forces preemption and
recomputation, an odd block size moves block boundaries), never *which* tokens: greedy output
must equal Hugging Face's token for token. A wrong position rotates the keys wrongly (RoPE), a
wrong slot writes a token's K/V over someone else's, a wrong ``seq_len`` hides context: each
one changes the tokens sooner or later.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grading.remote import LearnerError
from grading.suite import graded
from tests.labs.common import as_int, describe
from tests.labs.lab_09.support import runner

from .conftest import MAX_NEW, PROMPTS, hf_greedy, tiny_checkpoint

DOC = "phases/05-end-to-end/README.md"


#: Every number of a step of the tiny model (ids, positions, slots, lengths) is far below this:
#: a larger one is refused before the judge's engine sizes anything with it.
LIMIT = 1 << 20


def judge_inputs(got: Any) -> Any:
    """What the learner's ``prepare_inputs`` returned, as the judge's own ``ModelInputs``: each
    field read from the learner process, a torch tensor (by value) of whole numbers, or a whole
    number, each in ``[0, LIMIT)``."""
    import numpy as np
    import torch

    from mini_vllm.worker.model_inputs import ModelInputs

    values: dict[str, Any] = {}
    for field in dataclasses.fields(ModelInputs):
        value, what = getattr(got, field.name), f"prepare_inputs(...).{field.name}"
        if field.name.startswith("max_"):
            # A numpy integer crosses as the judge's own numpy scalar: the dtypes test grades
            # the type, and the engine here gets the same number either way.
            value = as_int(int(value) if isinstance(value, np.integer) else value, what)
            low = high = value
        elif isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
            low, high = (int(value.min()), int(value.max())) if value.numel() else (0, 0)
        else:
            raise AssertionError(f"{what} should be a torch tensor of ints, got {describe(value)}")
        if not 0 <= low <= high < LIMIT:
            raise AssertionError(f"{what} holds {low if low < 0 else high}, out of any range")
        values[field.name] = value
    return ModelInputs(**values)


def check_against_the_step(got: Any, want: Any, step: int) -> None:
    """Your inputs for the engine's step ``step`` are the ones the step implies: the same shape
    and values, field by field, as the reference computes from the same arguments (dtypes are
    the dtypes test's). Checked before the engine uses them: inputs that recompute every token
    from position 0 give Hugging Face's tokens too, and a reply of a few bytes a token could
    otherwise size the judge's attention."""
    for field in dataclasses.fields(want):
        mine, ref = getattr(got, field.name), getattr(want, field.name)
        what = f"step {step} of the engine: prepare_inputs(...).{field.name}"
        if isinstance(ref, int):
            assert mine == ref, f"{what} is {mine}; this step's is {ref}"
            continue
        assert tuple(mine.shape) == tuple(ref.shape), (
            f"{what} has shape {tuple(mine.shape)}; this step's is {tuple(ref.shape)}"
        )
        diff = (mine.long() != ref.long()).flatten().nonzero()
        if len(diff):
            i = int(diff[0])
            raise AssertionError(
                f"{what} differs from this step's at flat index {i}: "
                f"{mine.flatten()[i].item()} where {ref.flatten()[i].item()} belongs "
                f"(the field begins {mine.flatten()[:12].tolist()})"
            )


def generate(batches: int = 1, **options: Any) -> dict[str, Any]:
    """The engine's greedy tokens for PROMPTS, on your ``prepare_inputs``.

    The engine runs here, in the judge (``LLM`` options ``options``; the same prompts generated
    ``batches`` times on one engine): at each step its runner hands the step's plain lists to
    your function in the learner process, and takes the tensors it returns. Your code sees the
    step's lists, never the engine, so it cannot tell a step of the engine from a hand-made
    batch (its call stack is the same), nor change what the engine does with its answer.

    Returns ``{"tokens": [per batch, per prompt: ids], "cached": [per batch, per prompt:
    num_cached_tokens], "hits": [prefix-cache hits after each batch], "preemptions": n,
    "calls": n}``.
    """
    import torch

    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.worker.model_inputs import prepare_inputs as reference_prepare_inputs

    mod = runner("prepare_inputs")  # a stub, or a broken import, is reported as such
    try:  # one token, to tell a stub helper (NOT STARTED) before the engine loads a model
        mod.prepare_inputs([[1]], [0], [1], [[1]], 16)
    except NotImplementedError:
        raise
    except LearnerError:
        pass  # the engine's own steps decide
    calls = [0]

    def yours(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        # The reference first, while the arguments are as the engine made them.
        want = reference_prepare_inputs(*args, **kwargs)
        got = judge_inputs(mod.prepare_inputs(*args, **kwargs))
        check_against_the_step(got, want, calls[0])
        return got

    torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    llm = LLM(tiny_checkpoint(), skip_tokenizer_init=True, device="cpu", dtype="float32", **options)
    llm.llm_engine.model_runner.prepare_inputs_fn = yours
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    result: dict[str, Any] = {"tokens": [], "cached": [], "hits": []}
    for _ in range(batches):
        outputs = llm.generate(
            [{"prompt_token_ids": list(p)} for p in PROMPTS], params, use_tqdm=False
        )
        result["tokens"].append([[int(t) for t in o.outputs[0].token_ids] for o in outputs])
        result["cached"].append([int(o.num_cached_tokens or 0) for o in outputs])
        result["hits"].append(int(llm.get_stats().prefix_cache_hits))
    result["preemptions"] = int(llm.get_stats().num_preemptions)
    result["calls"] = calls[0]
    assert result["calls"] > 0, "the engine did not call your prepare_inputs"
    return result


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
