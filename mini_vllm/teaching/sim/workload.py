"""Seeded request workloads for the simulator.

A workload is a list of ``RequestSpec``: what to submit and at which step. It is
plain data, separate from ``Request`` objects, so the same workload can be
replayed against several scheduler configurations and compared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mini_vllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    Attributes:
        request_id: Unique id; also keys the fake model's output.
        arrival_step: The engine step before which it is submitted.
        prompt_token_ids: The prompt.
        sampling_params: Length limits and stop tokens (the fake model ignores
            temperature and friends: its output is fixed by the seed).
        priority: Its priority under the priority policy (smaller runs first).
    """

    request_id: str
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    priority: int = 0


def make_workload(
    num_requests: int,
    seed: int,
    prompt_len: tuple[int, int] = (4, 20),
    max_tokens: tuple[int, int] = (2, 12),
    arrival_gap: tuple[int, int] = (0, 1),
    shared_prefix_len: int = 0,
    vocab_size: int = 64,
    ignore_eos: bool = False,
    priority: tuple[int, int] | None = None,
) -> list[RequestSpec]:
    """Draw a reproducible workload.

    Args:
        num_requests: How many requests.
        seed: Seed of the draw (independent of the fake model's seed).
        prompt_len: Inclusive range of prompt lengths, shared prefix included.
        max_tokens: Inclusive range of ``max_tokens``.
        arrival_gap: Inclusive range of steps between consecutive arrivals
            (0: same step). The first request arrives at step 0.
        shared_prefix_len: Leading tokens common to every prompt, to exercise
            prefix caching (prompts are lengthened to keep one own token).
        vocab_size: Token ids are drawn from ``range(vocab_size)``.
        ignore_eos: Set on every request (lengths then depend only on limits).
        priority: Inclusive range of priorities, or None for 0 everywhere. Drawn
            from a generator of its own, so asking for priorities leaves the
            rest of the workload of a seed unchanged.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    for name, (lo, hi) in (
        ("prompt_len", prompt_len),
        ("max_tokens", max_tokens),
        ("arrival_gap", arrival_gap),
    ):
        if lo > hi or lo < (0 if name == "arrival_gap" else 1):
            raise ValueError(f"bad {name} range {(lo, hi)}")
    rng = random.Random(seed)
    priority_rng = random.Random(f"priority-{seed}")
    shared = [rng.randrange(vocab_size) for _ in range(shared_prefix_len)]
    specs: list[RequestSpec] = []
    step = 0
    for i in range(num_requests):
        if i > 0:
            step += rng.randint(*arrival_gap)
        length = max(rng.randint(*prompt_len), shared_prefix_len + 1)
        prompt = shared + [rng.randrange(vocab_size) for _ in range(length - shared_prefix_len)]
        specs.append(
            RequestSpec(
                request_id=f"r{i}",
                arrival_step=step,
                prompt_token_ids=tuple(prompt),
                sampling_params=SamplingParams(
                    temperature=0.0,
                    max_tokens=rng.randint(*max_tokens),
                    ignore_eos=ignore_eos,
                ),
                priority=priority_rng.randint(*priority) if priority else 0,
            )
        )
    return specs
