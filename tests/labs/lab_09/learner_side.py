"""lab-09's helpers: the tiny model's one definition, and the call of the learner's
``prepare_inputs`` in the learner process; they never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; every call of the learner's ``prepare_inputs`` goes through
:func:`prepare_inputs` here (``support.runner``). The engine of the parity tests (mini-vLLM's
reference: scheduler, KV cache manager, model, attention, sampler) runs in the judge, which
imports this file as ``tests.labs.lab_09.learner_side`` for :func:`tiny_llama`, the model both
the engine and Hugging Face ``generate`` are built from.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

VOCAB = 128


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


def prepare_inputs(*args: Any, **kwargs: Any) -> list[Any]:
    """The learner's ``prepare_inputs(*args, **kwargs)``, and its arguments as they are after
    the call: ``[inputs, args, kwargs]``.

    Every call of the suite goes through here, the parity engine's included, so that the call
    that the purity test looks at is like all the others (the lists a call changed can only
    be seen here, in the learner process)."""
    import model_inputs as yours

    inputs = yours.prepare_inputs(*args, **kwargs)
    _GIVEN.append(list(args))
    return [inputs, list(args), kwargs]


#: The positional arguments of the last calls, the very lists the learner's function got: a
#: function may keep a caller's list and change it at a later call, so the purity test reads
#: them again after the later calls (tests/hostile/pad_the_callers_lists_one_call_later.py).
#: Bounded: the engine's parity tests call through here at every step.
_GIVEN: deque[list[Any]] = deque(maxlen=8)


def given_arguments(back: int) -> list[Any]:
    """The positional arguments of the call ``back`` calls before the last, as they are now."""
    return list(_GIVEN[-1 - back])
