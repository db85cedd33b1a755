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


#: The cost steps' block size: every request of both steps (5 + 16 and 5 + 1,600 tokens) fits one
#: block, so the work per request and per block is the same in both and only work per token can
#: grow (the README allows a loop over blocks; with blocks of 16 one loop over a request's blocks
#: ran 100 times as often in the big step and was taken for work per token).
COST_BLOCK_SIZE = 2048


def cost_step(num_reqs: int, tokens_per_req: int, block_size: int = COST_BLOCK_SIZE) -> list[Any]:
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


#: Every tensor field of a step's inputs (the purity tests read and overwrite them all).
TENSOR_FIELDS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "block_tables",
    "query_start_loc",
    "seq_lens",
    "logits_indices",
)

#: The fields of a step that the cost test reads.
COST_FIELDS = ("input_ids", "positions", "slot_mapping")


def _fields(inputs: Any) -> list[Any]:
    """The cost test's fields of ``inputs``, each an exact ``torch.Tensor``, or the name of the
    type of the first that is not (which no test takes for a right answer). Read where the
    caller reads it: in the trace, or inside the timed calls, so that an object that prepares
    the step only when its fields are read does that work where it is counted
    (tests/hostile/lab_09_compute_the_step_when_it_is_read.py)."""
    import torch

    fields = [getattr(inputs, name) for name in COST_FIELDS]
    for name, tensor in zip(COST_FIELDS, fields):
        if type(tensor) is not torch.Tensor:
            return [f"{name} is a {type(tensor).__name__}, not a torch.Tensor"]
    return fields


def _summary(inputs: Any) -> list[Any]:
    """What the cost test checks of each timed call: its token count, and its last position and
    slot, read through torch's own methods (exact tensors, torch functions disabled)."""
    import torch

    fields = _fields(inputs)
    if len(fields) != len(COST_FIELDS):
        return fields
    ids, positions, slots = fields
    with torch._C.DisableTorchFunction():
        return [int(ids.shape[0]), int(positions[-1]), int(slots[-1])]


def run_steps(step: StepArgs, calls: int) -> list[Any]:
    """``calls`` calls of the learner's ``prepare_inputs`` on ``step``, in the one request the
    judge times, each call's result read as it returns (a result read only at the end would
    leave the work of an object that prepares itself when read to the last call); the summary
    of the last one."""
    import model_inputs as yours

    summary: list[Any] = []
    for _ in range(calls):
        summary = _summary(yours.prepare_inputs(*step.args))
    return summary


def lines_run(step: StepArgs) -> list[Any]:
    """One call of the learner's ``prepare_inputs`` on ``step``, with a line trace on: how many
    lines of Python ran in this thread during the call (each pass of a loop or comprehension
    over a line counts), how many bytecode instructions, reading the result's fields included,
    and those fields (``COST_FIELDS``, whole, compared in the judge with the reference's).

    Every line counts, whatever file or namespace its code claims: code compiled under another
    file name, or run in another module's globals, is Python of the call too
    (tests/hostile/lab_09_per_token_code_named_another_file.py). Lines alone miss Python that
    runs per token on one line, with no loop: an expression of one term per token, generated
    as text and compiled once (tests/hostile/lab_09_unroll_the_tokens_on_one_line.py); its
    bytecode instructions grow with the tokens, so they are counted too (``f_trace_opcodes``
    on every frame). What numpy and torch run in C is not Python; the few Python lines of their
    wrappers, and of this helper, are the same for a small step and a big one, so the judge,
    comparing two steps, sees only growth."""
    import sys

    import model_inputs as yours

    count = [0, 0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            count[1] += 1
        elif event == "line":
            count[0] += 1
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        # The fields are read inside the trace: what reading them runs is the call's work too.
        fields = _fields(yours.prepare_inputs(*step.args))
    finally:
        sys.settrace(previous)
    return [*count, *fields]


def _overwrite(tensor: Any, value: int) -> None:
    """Write ``value`` into every element of the memory ``tensor`` shows, as a caller's write
    would land: through a plain tensor over the same storage, offset, size and stride, read
    with torch's C methods (torch functions disabled), under ``inference_mode`` (where the
    runner writes), so that nothing the learner's tensor class says of itself, a ``fill_`` that
    refuses included, decides whether its memory is written
    (tests/hostile/lab_09_tables_that_refuse_fill.py). Only torch's own refusal to write the
    plain tensor is passed over: memory torch will not write is no buffer a caller writes
    into."""
    import torch

    base = torch._C.TensorBase
    with torch._C.DisableTorchFunction():
        plain = torch.empty(0, dtype=base.dtype.__get__(tensor))
        plain.set_(
            base.untyped_storage(tensor),
            base.storage_offset(tensor),
            base.size(tensor),
            base.stride(tensor),
        )
        with torch.inference_mode(), contextlib.suppress(RuntimeError):
            plain.fill_(value)


def prepare_after_writing(*args: Any) -> Any:
    """The step prepared, every tensor of the result overwritten with -7 (as a caller may: the
    runner, on a CPU device, writes a late decode's sampled token into ``input_ids``), then the
    same step prepared again: the second call's inputs."""
    import torch

    first = prepare_inputs(*args)[0]
    for name in TENSOR_FIELDS:
        tensor = getattr(first, name)
        if issubclass(type(tensor), torch._C.TensorBase):  # else the tests that read it fail
            _overwrite(tensor, -7)
    return prepare_inputs(*args)[0]
