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

import contextlib
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


def cost_step(num_reqs: int, tokens_per_req: int, block_size: int = 16) -> list[Any]:
    """The arguments of the cost test's step: ``num_reqs`` requests, each with 5 tokens cached
    and ``tokens_per_req`` scheduled (request ``i``'s tokens are ``1000 * i ..``, its blocks
    distinct ids from 1). The judge builds the same step for its yardstick (the reference)."""
    known = 5 + tokens_per_req
    num_blocks = -(-known // block_size)
    return [
        [list(range(1000 * i, 1000 * i + known)) for i in range(num_reqs)],
        [5] * num_reqs,
        [tokens_per_req] * num_reqs,
        [list(range(1 + i * num_blocks, 1 + (i + 1) * num_blocks)) for i in range(num_reqs)],
        block_size,
    ]


class StepArgs:
    """A step's arguments, kept in the learner process (the judge holds a handle to it)."""

    def __init__(self, num_reqs: int, tokens_per_req: int) -> None:
        self.args = cost_step(num_reqs, tokens_per_req)


def _summary(inputs: Any) -> list[int]:
    """What the cost test checks of a step: its token count, and its last position and slot."""
    return [
        int(inputs.input_ids.shape[0]),
        int(inputs.positions[-1]),
        int(inputs.slot_mapping[-1]),
    ]


def run_steps(step: StepArgs, calls: int) -> list[int]:
    """``calls`` calls of the learner's ``prepare_inputs`` on ``step``, in the one request the
    judge times; the summary of the last one."""
    import model_inputs as yours

    inputs = None
    for _ in range(calls):
        inputs = yours.prepare_inputs(*step.args)
    return _summary(inputs)


def lines_run(step: StepArgs) -> list[int]:
    """One call of the learner's ``prepare_inputs`` on ``step``, with a line trace on: how many
    lines of the learner's own file ran (each pass of a loop or comprehension over a line
    counts), and the call's summary. numpy, torch and the standard library are not counted."""
    import sys

    import model_inputs as yours

    mine = yours.__file__
    count = [0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            count[0] += 1
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == mine else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        inputs = yours.prepare_inputs(*step.args)
    finally:
        sys.settrace(previous)
    return [count[0], *_summary(inputs)]


def prepare_after_writing(*args: Any) -> Any:
    """The step prepared, every tensor of the result overwritten with -7 (as a caller may: the
    runner, on a CPU device, writes a late decode's sampled token into ``input_ids``), then the
    same step prepared again: the second call's inputs."""
    first = prepare_inputs(*args)[0]
    for name in (
        "input_ids",
        "positions",
        "slot_mapping",
        "block_tables",
        "query_start_loc",
        "seq_lens",
        "logits_indices",
    ):
        # A tensor the caller cannot write is no shared buffer either.
        with contextlib.suppress(Exception):
            getattr(first, name).fill_(-7)
    return prepare_inputs(*args)[0]
