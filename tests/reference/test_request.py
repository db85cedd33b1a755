"""Reference tests of ``SamplingParams``, ``Request`` and ``RequestStatus`` (upstream semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.request import ConstantList, FinishReason, Request, RequestStatus
from mini_vllm.sampling_params import SamplingParams, SamplingType

BLOCK_SIZE = 4


# ---------------------------------------------------------------- SamplingParams


def test_sampling_params_defaults_match_upstream() -> None:
    sp = SamplingParams()
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k) == (1, 1.0, 1.0, 0)
    assert (sp.max_tokens, sp.min_tokens, sp.seed, sp.ignore_eos) == (16, 0, None, False)
    assert sp.stop_token_ids == []
    assert sp.sampling_type == SamplingType.RANDOM
    assert sp.eos_token_id is None


def test_zero_temperature_is_greedy_and_normalises_truncation() -> None:
    sp = SamplingParams(temperature=0.0, top_p=0.5, top_k=7)
    assert sp.sampling_type == SamplingType.GREEDY
    assert (sp.top_p, sp.top_k) == (1.0, 0)


def test_seed_selects_seeded_sampling_and_minus_one_means_none() -> None:
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(seed=-1).seed is None


def test_tiny_positive_temperature_is_raised() -> None:
    assert SamplingParams(temperature=1e-3).temperature == pytest.approx(1e-2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 2, "temperature": 0.0},  # n greedy samples are one sample
        {"n": 0},
        {"stop": ""},
        {"stop": ["ok", ""]},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"max_tokens": 0},
        {"min_tokens": -1},
        {"min_tokens": 5, "max_tokens": 4},
        {"stop_token_ids": [1, "2"]},
    ],
)
def test_invalid_sampling_params_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_logprobs_true_means_one() -> None:
    """Upstream's shorthand (``SamplingParams.__post_init__``): ``logprobs=True`` asks for the
    sampled token and the top one, as OpenAI's ``logprobs: true``."""
    assert SamplingParams(logprobs=True).logprobs == 1


def test_top_k_must_be_an_int() -> None:
    with pytest.raises(TypeError):
        SamplingParams(top_k=1.5)  # type: ignore[arg-type]


def test_update_from_generation_config_respects_ignore_eos() -> None:
    sp = SamplingParams(stop_token_ids=[9])
    sp.update_from_generation_config({"eos_token_id": [2, 5]}, eos_token_id=2)
    assert sp.eos_token_id == 2
    assert sorted(sp.stop_token_ids or []) == [5, 9]
    assert sp.all_stop_token_ids == {2, 5, 9}

    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({}, eos_token_id=2)
    assert ignoring.eos_token_id is None
    assert ignoring.all_stop_token_ids == {2}


def test_clone_is_independent() -> None:
    sp = SamplingParams(stop_token_ids=[1])
    clone = sp.clone()
    clone.update_from_generation_config({}, eos_token_id=7)
    assert clone.eos_token_id == 7 and sp.eos_token_id is None
    assert clone == SamplingParams(stop_token_ids=[1], _eos_token_id=7, _all_stop_token_ids={1, 7})


# ---------------------------------------------------------------- RequestStatus


def test_request_status_finished_partition() -> None:
    unfinished = {RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED}
    for status in RequestStatus:
        assert RequestStatus.is_finished(status) == (status not in unfinished)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
        (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
        (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
        (RequestStatus.FINISHED_IGNORED, FinishReason.LENGTH),
        (RequestStatus.FINISHED_ERROR, FinishReason.ERROR),
        (RequestStatus.RUNNING, None),
        (RequestStatus.PREEMPTED, None),
    ],
)
def test_finished_reason_mapping(status: RequestStatus, reason: FinishReason | None) -> None:
    assert RequestStatus.get_finished_reason(status) == reason


def test_finish_reason_strings() -> None:
    assert [str(r) for r in FinishReason] == ["stop", "length", "abort", "error", "repetition"]


# ---------------------------------------------------------------- Request


def _hasher():
    return get_request_block_hasher(BLOCK_SIZE, sha256)


def test_new_request_counters() -> None:
    req = Request("a", [1, 2, 3], SamplingParams(max_tokens=5), arrival_time=1.5)
    assert req.status == RequestStatus.WAITING
    assert (req.num_tokens, req.num_prompt_tokens, req.num_output_tokens) == (3, 3, 0)
    assert req.num_tokens_with_spec == 3
    assert req.num_computed_tokens == 0 and req.num_preemptions == 0
    assert req.max_tokens == 5 and req.arrival_time == 1.5
    assert req.stop_reason is None and not req.is_finished()
    assert req.get_finished_reason() is None


def test_append_output_tokens_updates_all_views() -> None:
    req = Request("a", [1, 2, 3], SamplingParams())
    req.append_output_token_ids(4)
    req.append_output_token_ids([5, 6])
    assert list(req.output_token_ids) == [4, 5, 6]
    assert list(req.all_token_ids) == [1, 2, 3, 4, 5, 6]
    assert req.prompt_token_ids == [1, 2, 3]
    assert (req.num_tokens, req.num_output_tokens) == (6, 3)


def test_token_views_are_read_only() -> None:
    req = Request("a", [1, 2], SamplingParams())
    assert isinstance(req.all_token_ids, ConstantList)
    for mutate in (
        lambda: req.all_token_ids.append(3),  # type: ignore[attr-defined]
        lambda: req.output_token_ids.extend([3]),  # type: ignore[attr-defined]
        lambda: req.all_token_ids.__setitem__(0, 9),
    ):
        with pytest.raises(TypeError):
            mutate()
    assert req.all_token_ids[0:2] == [1, 2] and req.all_token_ids.copy() == [1, 2]


def test_prompt_is_copied() -> None:
    prompt = [1, 2, 3]
    req = Request("a", prompt, SamplingParams())
    prompt.append(4)
    assert req.num_tokens == 3


def test_empty_prompt_and_missing_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        Request("a", [], SamplingParams())
    with pytest.raises(ValueError):
        Request("a", [1], None)  # type: ignore[arg-type]


def test_eos_token_resolution() -> None:
    assert Request("a", [1], SamplingParams(), eos_token_id=2).eos_token_id == 2
    assert Request("a", [1], SamplingParams(ignore_eos=True), eos_token_id=2).eos_token_id is None
    sp = SamplingParams()
    sp.update_from_generation_config({}, eos_token_id=7)
    assert Request("a", [1], sp).eos_token_id == 7


def test_max_tokens_none_is_kept_for_the_scheduler() -> None:
    assert Request("a", [1], SamplingParams(max_tokens=None)).max_tokens is None


def test_block_hashes_cover_full_blocks_only() -> None:
    req = Request("a", list(range(10)), SamplingParams(), block_hasher=_hasher())
    assert len(req.block_hashes) == 2  # 10 tokens: 2 full blocks of 4
    req.append_output_token_ids(10)
    assert len(req.block_hashes) == 2
    req.append_output_token_ids(11)
    assert len(req.block_hashes) == 3


def test_no_hasher_means_no_hashes() -> None:
    req = Request("a", list(range(10)), SamplingParams())
    req.append_output_token_ids([1, 2, 3])
    assert req.block_hashes == []


def test_hasher_is_only_asked_for_new_blocks() -> None:
    inner = _hasher()
    seen_starts: list[int] = []

    def spy(request: Request):
        seen_starts.append(len(request.block_hashes))
        return inner(request)

    req = Request("a", list(range(8)), SamplingParams(), block_hasher=spy)
    for tok in range(5):
        req.append_output_token_ids(tok)
    # Every call starts after the hashes already computed: nothing is rehashed.
    assert seen_starts == [0, 2, 2, 2, 2, 3]
    assert len(req.block_hashes) == 3


@settings(max_examples=50, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=20),
    outputs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), max_size=8),
)
def test_incremental_hashes_equal_hashing_from_scratch(
    prompt: list[int], outputs: list[list[int]]
) -> None:
    hasher = _hasher()
    req = Request("a", prompt, SamplingParams(), block_hasher=hasher)
    for chunk in outputs:
        req.append_output_token_ids(chunk)
    fresh = Request("b", list(req.all_token_ids), SamplingParams(), block_hasher=hasher)
    assert req.block_hashes == fresh.block_hashes
    assert len(req.block_hashes) == req.num_tokens // BLOCK_SIZE
