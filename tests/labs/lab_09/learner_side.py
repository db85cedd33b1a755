"""lab-09's helpers in the learner process: they build the tiny model, run the engine, and never
judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the parity tests reach it with ``learner_module("learner_side")``. The engine
(mini-vLLM's reference: scheduler, KV cache manager, model, attention, sampler) runs here, in
the learner process, on the learner's ``prepare_inputs``; what comes back to the judge is plain
data: the generated token ids, the engine's counters, and how many times ``prepare_inputs`` ran.
The judge compares them with Hugging Face's greedy answers, which it computes itself.

:func:`tiny_llama` is the one definition of the model: the judge imports this file as
``tests.labs.lab_09.learner_side`` and builds the same model (same config, same seed) for
Hugging Face ``generate``. The learner process saves its copy in its own private temporary
folder (the judge's files are not visible there), once per process.
"""

from __future__ import annotations

import os
from typing import Any

VOCAB = 128

_checkpoint: str | None = None


def tiny_llama() -> Any:
    """A 2-layer random Llama (GQA 4/2 heads, 64 wide, a 128-token vocabulary), built by
    transformers under ``torch.manual_seed(0)``: the same weights in every process.

    Weights are drawn wide (``initializer_range=0.2``) so that greedy decoding is decided by the
    model, never by float noise between two nearly equal logits.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
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
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).float().eval()


def _tiny_checkpoint() -> str:
    """:func:`tiny_llama` saved by transformers in this process's temporary folder, once."""
    global _checkpoint
    if _checkpoint is None or not os.path.isdir(_checkpoint):
        import tempfile

        # The learner's uid has no passwd entry, and importing transformers can import
        # torch._dynamo, whose cache folder is named by getpass.getuser(): without a user name
        # in the environment that raises KeyError (seen on a GPU host with torchvision).
        os.environ.setdefault("USER", "learner")
        os.environ.setdefault("LOGNAME", "learner")

        path = tempfile.mkdtemp(prefix="lab09_tiny_llama_")
        tiny_llama().save_pretrained(path)
        _checkpoint = path
    return _checkpoint


def arguments_after_prepare_inputs(
    token_ids: list[list[int]],
    num_computed_tokens: list[int],
    num_scheduled_tokens: list[int],
    block_ids: list[list[int]],
    block_size: int,
) -> list[Any]:
    """The learner's ``prepare_inputs`` on these lists; returns the four lists as they are
    after the call (``[token_ids, num_computed_tokens, num_scheduled_tokens, block_ids]``)."""
    import model_inputs as yours

    yours.prepare_inputs(
        token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size
    )
    return [token_ids, num_computed_tokens, num_scheduled_tokens, block_ids]


def run_engine(
    prompts: list[list[int]], max_new: int, options: dict[str, Any], batches: int = 1
) -> dict[str, Any]:
    """Greedy generation of ``prompts`` by the engine, on the learner's ``prepare_inputs``.

    The engine's runner flattens each step from its persistent batch; ``prepare_inputs_fn``
    makes it hand the step to the learner's function instead (as plain lists, the lab's
    contract), counted. ``options`` are ``LLM`` keyword arguments; the same prompts are
    generated ``batches`` times on one engine.

    Returns ``{"tokens": [per batch, per prompt: ids], "cached": [per batch, per prompt:
    num_cached_tokens], "hits": [prefix-cache hits after each batch], "preemptions": n,
    "calls": n}``.
    """
    import model_inputs as yours
    import torch

    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    checkpoint = _tiny_checkpoint()
    torch.set_num_threads(1)
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return yours.prepare_inputs(*args, **kwargs)

    llm = LLM(checkpoint, skip_tokenizer_init=True, device="cpu", dtype="float32", **options)
    llm.llm_engine.model_runner.prepare_inputs_fn = counted
    params = SamplingParams(temperature=0.0, max_tokens=max_new)
    result: dict[str, Any] = {"tokens": [], "cached": [], "hits": []}
    for _ in range(batches):
        outputs = llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False
        )
        result["tokens"].append([[int(t) for t in o.outputs[0].token_ids] for o in outputs])
        result["cached"].append([int(o.num_cached_tokens or 0) for o in outputs])
        result["hits"].append(int(llm.get_stats().prefix_cache_hits))
    result["preemptions"] = int(llm.get_stats().num_preemptions)
    result["calls"] = calls[0]
    return result
