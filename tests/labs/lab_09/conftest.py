"""Fixtures of lab-09's parity tests: the prompts and Hugging Face's greedy answers.

The engine and Hugging Face ``generate`` both run here, in the judge, on the same tiny random
Llama (``learner_side.tiny_llama``, saved once per session for the engine); the engine calls the
learner's ``prepare_inputs`` in the learner process at every step (``test_parity.generate``).
torch and transformers are imported when a parity test first needs them, never at collection.

The hand-made batches of ``test_prepare_inputs.py`` (part 1, a few milliseconds each) run
before the engine parity of ``test_parity.py`` (part 2, seconds each): a mistake that both
catch is reported by the first, and a grader that stops at the first failure never loads a
model for it.
"""

from __future__ import annotations

import functools
import tempfile

import pytest

VOCAB = 128
MAX_NEW = 16


def make_prompts() -> list[list[int]]:
    """Eight prompts of 3..40 tokens, three of them sharing a 37-token prefix (2 full blocks of
    16, so that prefix caching has something to hit), drawn from a fixed seed."""
    import random

    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(5)]
    base = [rng.randrange(VOCAB) for _ in range(37)]
    return [*prompts, [*base, 1, 2, 3], [*base, 4, 5], base[:33]]


PROMPTS = make_prompts()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Part 1 (the hand-made batches) before part 2 (the engine), each in file order."""
    items.sort(key=lambda item: item.path.name == "test_parity.py")


_folders: list[tempfile.TemporaryDirectory[str]] = []  # removed when the judge exits


@functools.cache
def tiny_checkpoint() -> str:
    """:func:`learner_side.tiny_llama` saved by transformers for the judge's engine, once per
    judge process (when a parity test first needs it, so that a stub never loads torch)."""
    from tests.labs.lab_09.learner_side import tiny_llama

    folder = tempfile.TemporaryDirectory(prefix="lab09_tiny_llama_")
    _folders.append(folder)
    tiny_llama().save_pretrained(folder.name)
    return folder.name


@functools.cache
def hf_greedy() -> list[list[int]]:
    """Hugging Face's own greedy continuation of every prompt (one at a time, no padding),
    computed in the judge once per judge process."""
    import torch

    from tests.labs.lab_09.learner_side import VOCAB as MODEL_VOCAB
    from tests.labs.lab_09.learner_side import tiny_llama

    assert MODEL_VOCAB == VOCAB
    model = tiny_llama()
    answers: list[list[int]] = []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                pad_token_id=0,
            )
            answers.append(out[0, len(prompt) :].tolist())
    return answers
