"""Fixtures of lab-09's parity tests: the prompts and Hugging Face's greedy answers.

The engine runs in the learner process (``learner_side.run_engine``), on the learner's
``prepare_inputs``, and only its tokens come back. Hugging Face ``generate`` runs here, in the
judge, on the same tiny random Llama: ``learner_side.tiny_llama`` is the one definition both
processes build it from (same config, same seed, so the same weights). torch and transformers
are imported when a parity test first needs the answers, never at collection, and not at all
while ``prepare_inputs`` is not started.

The hand-made batches of ``test_prepare_inputs.py`` (part 1, a few milliseconds each) run
before the engine parity of ``test_parity.py`` (part 2, seconds each): a mistake that both
catch is reported by the first, and a grader that stops at the first failure never loads a
model for it.
"""

from __future__ import annotations

import functools

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
