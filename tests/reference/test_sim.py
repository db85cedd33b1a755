"""The simulator, and end-to-end properties of the scheduler + KV cache manager.

The fake model's output is known in advance, so every simulated request can be
checked token for token. Hypothesis draws random arrivals, lengths, budgets and
tiny KV pools; whatever it draws, every request must finish with exactly the
tokens the model dictates, no block may leak, the budget and ``max_num_seqs``
must hold at every step, and first admissions must follow arrival order.
The simulator itself checks the block pool and the runner contract every step.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm.core.kv_cache_manager import cdiv
from mini_vllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from mini_vllm.request import FinishReason
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.invariants import check_block_pool
from mini_vllm.teaching.sim import (
    FakeModelRunner,
    RequestSpec,
    RunnerContractError,
    SimConfig,
    Simulator,
    expected_output,
    fake_next_token,
    make_workload,
    print_result,
    render_plain,
)
from mini_vllm.teaching.sim.__main__ import main


def run(config: SimConfig, workload: list[RequestSpec]):
    return Simulator(config, workload).run()


# ------------------------------------------------------------------ fake model


def test_fake_next_token_is_deterministic_and_in_range() -> None:
    tokens = [fake_next_token(0, "r0", p, 16) for p in range(200)]
    assert tokens == [fake_next_token(0, "r0", p, 16) for p in range(200)]
    assert all(0 <= t < 16 for t in tokens) and len(set(tokens)) > 8
    assert tokens != [fake_next_token(1, "r0", p, 16) for p in range(200)]
    assert tokens != [fake_next_token(0, "r1", p, 16) for p in range(200)]


def test_expected_output_stop_rules() -> None:
    seq = [fake_next_token(3, "x", 5 + i, 8) for i in range(30)]
    eos = seq[2]
    first_eos = seq.index(eos)
    out, reason = expected_output("x", 5, SamplingParams(max_tokens=30), eos, 100, 3, 8)
    assert (out, reason) == (seq[: first_eos + 1], FinishReason.STOP)
    out, reason = expected_output(
        "x", 5, SamplingParams(max_tokens=4, ignore_eos=True), eos, 100, 3, 8
    )
    assert (out, reason) == (seq[:4], FinishReason.LENGTH)
    out, _ = expected_output("x", 5, SamplingParams(max_tokens=None), None, 12, 3, 8)
    assert out == seq[:7]  # max_model_len 12 - 5 prompt tokens
    out, reason = expected_output(
        "x", 5, SamplingParams(max_tokens=30, min_tokens=first_eos + 2), eos, 100, 3, 8
    )
    assert len(out) > first_eos + 1 or reason == FinishReason.LENGTH


# ------------------------------------------------------------------ runner contract


def test_runner_rejects_a_block_table_that_reads_the_wrong_tokens() -> None:
    runner = FakeModelRunner(block_size=4, seed=0, vocab_size=16)
    sp = SamplingParams()

    def new_req(rid: str, tokens: list[int], blocks: list[int], computed: int) -> NewRequestData:
        return NewRequestData(rid, tokens, sp, (blocks,), computed)

    first = SchedulerOutput(
        scheduled_new_reqs=[new_req("a", [1, 2, 3, 4, 5], [1, 2], 0)],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={"a": 5},
        total_num_scheduled_tokens=5,
        finished_req_ids=set(),
    )
    assert set(runner.execute_model(first)) == {"a"}
    # b claims a 4-token prefix hit on block 1, but its prompt starts differently.
    bad = SchedulerOutput(
        scheduled_new_reqs=[new_req("b", [9, 9, 9, 9, 9, 9], [1, 3], 4)],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={"b": 2},
        total_num_scheduled_tokens=2,
        finished_req_ids=set(),
    )
    with pytest.raises(RunnerContractError, match="position 0"):
        runner.execute_model(bad)


def test_runner_rejects_a_short_block_table() -> None:
    runner = FakeModelRunner(block_size=4, seed=0, vocab_size=16)
    out = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("a", list(range(6)), SamplingParams(), ([1],), 0)],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={"a": 6},
        total_num_scheduled_tokens=6,
        finished_req_ids=set(),
    )
    with pytest.raises(RunnerContractError, match="no slot"):
        runner.execute_model(out)


# ------------------------------------------------------------------ simulator


def test_default_simulation_matches_the_model_and_preempts_repeatedly() -> None:
    config = SimConfig(num_gpu_blocks=12, block_size=4, seed=0, scheduler_reserve_full_isl=False)
    result = run(config, make_workload(6, seed=0))
    assert result.mismatches == []
    assert set(result.finish_reasons) == {f"r{i}" for i in range(6)}
    # The pool is too small for the workload: without the admission gate some
    # request is preempted at least twice, recomputed, and still produces exactly
    # the model's tokens.
    assert max(req.num_preemptions for req in result.requests.values()) >= 2
    assert any(record.preempted for record in result.steps)
    pool = result.kv_cache_manager.block_pool
    check_block_pool(pool)
    assert pool.get_num_free_blocks() == config.num_gpu_blocks - 1


def test_admission_gate_preempts_less_and_changes_no_output() -> None:
    # The gate only delays admissions: every output is still the model's, and over
    # a few tight workloads it saves preemptions (and so recomputed tokens).
    totals = {}
    for gate in (False, True):
        preemptions = computed = 0
        for seed in range(12):
            config = SimConfig(num_gpu_blocks=12, seed=seed, scheduler_reserve_full_isl=gate)
            result = run(config, make_workload(8, seed=seed))
            assert result.mismatches == []
            preemptions += sum(req.num_preemptions for req in result.requests.values())
            computed += sum(record.num_scheduled_tokens for record in result.steps)
        totals[gate] = (preemptions, computed)
    assert totals[True][0] < totals[False][0], totals
    assert totals[True][1] < totals[False][1], totals


def test_simulation_is_deterministic() -> None:
    config = SimConfig(seed=5, eos_token_id=3, vocab_size=16)
    workload = make_workload(8, seed=5, shared_prefix_len=8, vocab_size=16)
    assert render_plain(run(config, workload)) == render_plain(run(config, workload))


def test_no_admission_in_a_step_that_preempted() -> None:
    config = SimConfig(num_gpu_blocks=9, seed=2)
    result = run(config, make_workload(8, seed=2, arrival_gap=(0, 0)))
    assert result.mismatches == []
    preempting = [r for r in result.steps if r.preempted]
    assert preempting
    assert all(not r.admitted and not r.resumed for r in preempting)


def test_shared_prefix_produces_hits() -> None:
    config = SimConfig(num_gpu_blocks=30, max_model_len=64)
    workload = make_workload(6, seed=1, prompt_len=(12, 20), shared_prefix_len=8)
    result = run(config, workload)
    assert result.mismatches == []
    assert result.prefix_cache_stats.hits >= 8 * 5  # everyone after r0 reuses 2 blocks
    assert any(record.prefix_hits for record in result.steps)


def test_caching_disabled_still_correct() -> None:
    config = SimConfig(num_gpu_blocks=10, enable_caching=False)
    result = run(config, make_workload(6, seed=4, shared_prefix_len=8))
    assert result.mismatches == [] and result.prefix_cache_stats.hits == 0


def test_infeasible_request_is_rejected_up_front() -> None:
    spec = RequestSpec("big", 0, tuple(range(12)), SamplingParams(max_tokens=6))
    # 17 KV slots = 5 blocks of 4 > 4 usable; one token less would fit.
    with pytest.raises(ValueError, match="could never run"):
        Simulator(SimConfig(num_gpu_blocks=5, block_size=4, max_model_len=64), [spec])
    ok = RequestSpec("ok", 0, tuple(range(12)), SamplingParams(max_tokens=5))
    assert run(SimConfig(num_gpu_blocks=5, block_size=4, max_model_len=64), [ok]).mismatches == []


def test_rendering_and_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "4", "--blocks", "10", "--seed", "1", "--plain"]) == 0
    text = capsys.readouterr().out
    assert "Schedule trace" in text and "matches model" in text and "NO" not in text
    assert main(["--requests", "3", "--blocks", "3", "--block-size", "4"]) == 2  # infeasible
    buffer = io.StringIO()
    print_result(run(SimConfig(), make_workload(3, seed=0)), file=buffer)
    assert "Schedule trace" in buffer.getvalue()


# ------------------------------------------------------------------ properties


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SimConfig, list[RequestSpec]]:
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_model_len = draw(st.integers(8, 32))
    max_num_seqs = draw(st.integers(1, 6))
    chunked = draw(st.booleans())
    budget = draw(st.integers(max_num_seqs, 24))
    if not chunked:
        budget = max(budget, max_model_len)
    workload = make_workload(
        draw(st.integers(1, 8)),
        seed=draw(st.integers(0, 2**16)),
        prompt_len=(1, max_model_len - 1),
        max_tokens=(1, 12),
        arrival_gap=(0, draw(st.integers(0, 3))),
        shared_prefix_len=draw(st.sampled_from([0, 0, 4])) if max_model_len > 5 else 0,
        vocab_size=8,
    )
    # A pool barely larger than the largest request can need: preemption is common.
    most_slots = max(
        min(len(spec.prompt_token_ids) + (spec.sampling_params.max_tokens or 0), max_model_len) - 1
        for spec in workload
    )
    num_blocks = cdiv(most_slots, block_size) + 1 + draw(st.integers(0, 4))
    config = SimConfig(
        num_gpu_blocks=max(num_blocks, 2),
        block_size=block_size,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3, 8])),
        enable_caching=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        vocab_size=8,
        eos_token_id=draw(st.sampled_from([None, 0])),
    )
    return config, workload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_with_the_models_tokens(
    scenario: tuple[SimConfig, list[RequestSpec]],
) -> None:
    config, workload = scenario
    result = run(config, workload)  # checks pool invariants and the runner every step

    assert result.mismatches == []
    assert set(result.finish_reasons) == {spec.request_id for spec in workload}
    assert all(req.is_finished() for req in result.requests.values())

    # No leaks: everything but the null block is free, and nobody holds a block.
    pool = result.kv_cache_manager.block_pool
    check_block_pool(pool)
    assert pool.get_num_free_blocks() == config.num_gpu_blocks - 1
    assert all(block.ref_cnt == 0 for block in pool.blocks[1:])
    assert not result.kv_cache_manager.req_to_blocks

    for record in result.steps:
        assert record.num_scheduled_tokens <= config.max_num_batched_tokens
        assert len(record.block_tables) <= config.max_num_seqs
        assert sum(n for _, n, _ in record.scheduled) == record.num_scheduled_tokens
        if record.preempted:
            assert not record.admitted and not record.resumed
        if config.long_prefill_token_threshold:
            assert all(n <= config.long_prefill_token_threshold for _, n, _ in record.scheduled)

    # FCFS: first admissions happen in arrival order.
    arrival_order = [spec.request_id for spec in workload]
    assert result.admission_order == arrival_order
