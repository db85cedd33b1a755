"""The sampler: greedy, temperature, top-k/top-p/min-p masks, penalties, per-request seeds,
min_tokens."""

from __future__ import annotations

import math

import pytest
import torch

from mini_vllm.sample.sampler import (
    PenaltyState,
    Sampler,
    SamplingMetadata,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    random_sample,
    token_counts,
)

NEG_INF = float("-inf")


def metadata(n: int, temperature: float = 1.0, **kwargs: object) -> SamplingMetadata:
    greedy = temperature == 0.0
    return SamplingMetadata(
        temperature=torch.full((n,), temperature),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=kwargs.pop("top_p", None),  # type: ignore[arg-type]
        top_k=kwargs.pop("top_k", None),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def test_top_k_keeps_exactly_k() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2, 5]), None)
    assert out[0].tolist() == [NEG_INF, 5.0, NEG_INF, 4.0, NEG_INF]
    assert out[1].tolist() == logits[1].tolist()  # k = vocab size: nothing masked


def test_top_p_keeps_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.7])).isfinite()
    assert kept[0].tolist() == [True, True, False, False]  # 0.5 < 0.7 <= 0.5 + 0.3
    kept = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.79])).isfinite()
    assert kept[0].tolist() == [True, True, False, False]
    kept = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.81])).isfinite()
    assert kept[0].tolist() == [True, True, True, False]
    # a tiny p still keeps the most likely token
    kept = apply_top_k_top_p(logits.clone(), None, torch.tensor([1e-6])).isfinite()
    assert kept[0].tolist() == [True, False, False, False]


def test_top_k_and_top_p_compose() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    kept = apply_top_k_top_p(logits.clone(), torch.tensor([3]), torch.tensor([0.99])).isfinite()
    assert kept[0].tolist() == [True, True, True, False]


def test_greedy_is_argmax_and_mixes_with_random_rows() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()
    greedy = sampler(logits, metadata(4, 0.0)).sampled_token_ids
    assert greedy.tolist() == logits.argmax(-1).tolist()
    mixed = SamplingMetadata(
        temperature=torch.tensor([0.0, 1.0, 0.0, 1.0]),
        all_greedy=False,
        all_random=False,
        top_p=None,
        top_k=torch.tensor([50, 1, 50, 1]),
    )
    # top_k=1 makes the random rows deterministic too: all four rows are the argmax
    assert sampler(logits, mixed).sampled_token_ids.tolist() == logits.argmax(-1).tolist()


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))

    def draw(rows: list[int], seed_row: int) -> int:
        gens = {rows.index(seed_row): torch.Generator().manual_seed(1234)}
        noise = torch.Generator().manual_seed(len(rows))  # the neighbours' randomness differs
        md = metadata(len(rows), 1.0, generators=gens, default_generator=noise)
        return Sampler()(logits[rows], md).sampled_token_ids[rows.index(seed_row)].item()

    alone = draw([2], 2)
    assert draw([0, 1, 2], 2) == alone
    assert draw([2, 0], 2) == alone


def test_random_sample_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1]).repeat(20_000, 1)
    tokens = random_sample(probs.clone(), {}, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.02)


def test_temperature_sharpens() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).repeat(5_000, 1)
    gen = torch.Generator().manual_seed(0)
    cold = Sampler()(logits, metadata(5_000, 0.1, default_generator=gen)).sampled_token_ids
    assert (cold == 0).float().mean() > 0.99
    hot = Sampler()(logits, metadata(5_000, 1.0, default_generator=gen)).sampled_token_ids
    assert math.isclose((hot == 0).float().mean().item(), 0.5, abs_tol=0.03)


def test_min_tokens_masks_stop_tokens() -> None:
    logits = torch.tensor([[0.0, 9.0, 1.0], [0.0, 9.0, 1.0]])
    md = metadata(2, 0.0, stop_token_masks={0: [1]})
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [2, 1]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_engine_seed_reproducible_across_batches(
    tiny_llama_dir, engines, temperature: float
) -> None:
    """A seeded request yields the same tokens alone or in a crowd; unseeded runs repeat with
    the engine seed."""
    from mini_vllm.sampling_params import SamplingParams

    # float32: in bfloat16 (a GPU's "auto") a batch of another size may round a logit across
    # a sampling threshold, which is numerics, not the generators this test is about. The
    # engine is the parity tests' "default" one, shared.
    llm = engines.get(tiny_llama_dir, dtype="float32")
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    others = [{"prompt_token_ids": [i, i + 1, i + 2]} for i in range(10, 40, 3)]
    seeded = SamplingParams(temperature=temperature or 1.0, top_p=0.9, seed=7, max_tokens=20)
    alone = llm.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids
    crowd_params = [seeded] + [SamplingParams(temperature=1.0, max_tokens=20)] * len(others)
    crowd = llm.generate([prompt, *others], crowd_params, use_tqdm=False)
    assert crowd[0].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=8, max_tokens=20)
    assert llm.generate([prompt], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_penalties_follow_their_definitions() -> None:
    """Token by token, as the definitions read: repetition divides a positive logit and
    multiplies a negative one of every token in the prompt or the output (Hugging Face's
    ``repetition_penalty``); frequency subtracts per occurrence in the output, presence once
    (OpenAI's); the prompt alone draws no frequency or presence penalty."""
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    logits = torch.randn(3, vocab, generator=gen) * 3
    prompts = [[1, 2, 2], [4], [0, 9]]
    outputs = [[2, 3, 3, 3], [], [9, 5]]
    presence, frequency, repetition = [0.5, -1.0, 0.0], [0.25, 2.0, 1.5], [1.3, 0.8, 1.0]
    pad = lambda rows: torch.tensor(  # noqa: E731
        [row + [vocab] * (4 - len(row)) for row in rows], dtype=torch.int64
    )
    prompt_mask = token_counts(pad(prompts), vocab) > 0
    state = PenaltyState(
        prompt_mask, token_counts(pad(outputs), vocab),
        torch.tensor(presence), torch.tensor(frequency), torch.tensor(repetition),
    )  # fmt: skip
    got = apply_penalties(logits, state)
    for r in range(3):
        for t in range(vocab):
            want = logits[r, t].item()
            if t in prompts[r] or t in outputs[r]:
                want = want / repetition[r] if want > 0 else want * repetition[r]
            count = outputs[r].count(t)
            want -= frequency[r] * count + presence[r] * (count > 0)
            assert got[r, t].item() == pytest.approx(want, rel=1e-6), (r, t)
    assert not torch.equal(got, logits), "the penalties returned the logits unchanged"


def test_penalties_change_the_greedy_token() -> None:
    """Upstream applies the penalties before the greedy argmax: a repeated token loses it."""
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    state = PenaltyState(
        torch.zeros(1, 3, dtype=torch.bool), torch.tensor([[2.0, 0.0, 0.0]]),
        torch.zeros(1), torch.tensor([0.1]), torch.ones(1),
    )  # fmt: skip
    meta = metadata(1, temperature=0.0, penalties=state)
    meta.temperature = None
    assert Sampler()(logits, meta).sampled_token_ids.tolist() == [1]
    assert Sampler()(logits, metadata(1, temperature=0.0)).sampled_token_ids.tolist() == [0]


def test_min_p_drops_tokens_below_its_share_of_the_best() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    kept = apply_min_p(probs.log(), torch.tensor([0.4, 1.0])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True, True, True, True]]
    kept = apply_min_p(probs.log(), torch.tensor([0.0, 0.0])).isfinite()
    assert kept.all(), "min_p = 0 keeps every token"
    gen = torch.Generator().manual_seed(3)
    meta = metadata(1, temperature=1.0, min_p=torch.tensor([0.4]), default_generator=gen)
    draws = {Sampler()(probs[:1].log(), meta).sampled_token_ids.item() for _ in range(200)}
    assert draws == {0, 1}, "a token below min_p times the best was drawn"


def test_allowed_token_ids_and_logit_bias_steer_greedy_and_random_rows() -> None:
    """``allowed_token_ids`` leaves only its tokens (greedy picks the best of them, a draw never
    leaves them); ``logit_bias`` adds to the logits before the argmax, so +100 forces a token."""
    logits = torch.tensor([[5.0, 1.0, 0.0, 2.0], [5.0, 1.0, 0.0, 2.0]])
    disallowed = torch.tensor([[True, False, False, True], [False, False, False, False]])
    bias = (torch.tensor([1]), torch.tensor([2]), torch.tensor([100.0]))
    greedy = metadata(2, temperature=0.0, disallowed_mask=disallowed, logit_bias=bias)
    greedy.temperature = None
    assert Sampler()(logits, greedy).sampled_token_ids.tolist() == [1, 2]
    gen = torch.Generator().manual_seed(0)
    random = metadata(2, temperature=1.0, disallowed_mask=disallowed, default_generator=gen)
    draws = {tuple(Sampler()(logits, random).sampled_token_ids.tolist()) for _ in range(100)}
    assert {row0 for row0, _ in draws} <= {1, 2}, "a draw left the allowed tokens"
    assert {row1 for _, row1 in draws} - {1, 2}, "the unrestricted row was restricted too"
    out = Sampler()(logits, greedy)
    assert logits[0, 0] == 5.0, "the sampler changed the caller's logits"
    assert out.sampled_token_ids.shape == (2,)
