"""lab-08, part 1: when a request stops (check_stop), and applying a step's output."""

from __future__ import annotations

from grading.suite import graded
from mini_vllm.request import FinishReason, Request, RequestStatus
from mini_vllm.sampling_params import SamplingParams
from tests.labs.lab_08.helpers import (
    DOC,
    HASHER,
    Engine,
    make_request,
    make_scheduler,
    num_free,
    running_ids,
    scheduler_module,
)


def appended(req, *tokens):
    """Append tokens one at a time; return check_stop's answer after each."""
    check_stop = scheduler_module().check_stop
    answers = []
    for token in tokens:
        req.append_output_token_ids(token)
        answers.append(check_stop(req, 64))
    return answers


@graded(2, "Stop conditions: the EOS token ends the request as FINISHED_STOPPED (finish reason "
           "'stop'), with no stop_reason", f"{DOC}#stop-conditions")
def test_eos_stops():
    """EOS is 7: the request stops on the first 7."""
    req = make_request("a", 4, max_tokens=10, eos=7)
    req.max_tokens = 10
    assert appended(req, 3, 7) == [False, True], "check_stop must return True on EOS only"
    assert req.status == RequestStatus.FINISHED_STOPPED, f"status is {req.status}"
    assert req.get_finished_reason() == FinishReason.STOP and req.stop_reason is None


@graded(2, "Stop conditions: ignore_eos ignores only EOS; stop_token_ids still end the request, "
           "and the stop token is recorded as stop_reason", f"{DOC}#stop-conditions")
def test_stop_tokens_apply_even_with_ignore_eos():
    """ignore_eos with EOS 7 and stop token 9: 7 goes on, 9 stops."""
    # Built as the engine builds it: the model's EOS is recorded in the sampling parameters
    # (all_stop_token_ids holds it even under ignore_eos: that set is for min_tokens masking).
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop_token_ids=[9])
    params.update_from_generation_config({}, eos_token_id=7)
    req = Request("a", [0, 1, 2, 3], params, eos_token_id=7, block_hasher=HASHER)
    req.max_tokens = 10
    assert appended(req, 7, 7, 9) == [False, False, True], (
        "under ignore_eos the EOS token (7) must not stop the request, but the stop token 9 must")
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == 9, (
        f"a stop token ends the request as FINISHED_STOPPED with stop_reason 9; got "
        f"{req.status}, stop_reason {req.stop_reason}")


@graded(2, "Stop conditions: max_tokens outputs end the request (FINISHED_LENGTH_CAPPED) on the "
           "max_tokens-th token, not one before or after", f"{DOC}#stop-conditions")
def test_max_tokens_stops_exactly():
    """max_tokens 3: the third output ends it."""
    req = make_request("a", 4, max_tokens=3)
    req.max_tokens = 3
    assert appended(req, 1, 2, 3) == [False, False, True], (
        "with max_tokens=3, check_stop answers False, False, True for the 1st, 2nd, 3rd token")
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req.get_finished_reason() == FinishReason.LENGTH


@graded(1, "Stop conditions: a request whose tokens reach max_model_len is FINISHED_LENGTH_CAPPED "
           "(the KV cache has no room beyond)", f"{DOC}#stop-conditions")
def test_max_model_len_stops():
    """60 prompt tokens and max_model_len 64: the 4th output ends it."""
    req = make_request("a", 60, max_tokens=50)
    req.max_tokens = 50
    assert appended(req, 1, 2, 3, 4) == [False, False, False, True], (
        "at 64 tokens (max_model_len) the request must stop")
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED


@graded(1, "Stop conditions: nothing stops a request before min_tokens outputs; EOS is checked "
           "before stop tokens", f"{DOC}#stop-conditions")
def test_min_tokens_and_the_order_of_checks():
    """min_tokens 3 defers EOS; EOS that is also a stop token is reported as EOS."""
    req = make_request("a", 4, max_tokens=10, eos=7, min_tokens=3)
    req.max_tokens = 10
    assert appended(req, 7, 7, 7) == [False, False, True], "EOS counts only from the 3rd output"
    both = make_request("b", 4, max_tokens=10, eos=7, stop_token_ids=[7])
    both.max_tokens = 10
    assert appended(both, 7) == [True]
    assert both.stop_reason is None, "EOS is checked first: no stop_reason for it"


@graded(2, "update_from_output appends the sampled tokens one by one and stops at the first "
           "stop: the output is trimmed after it, the request is freed and leaves running",
        f"{DOC}#finishing-and-freeing")
def test_update_from_output_trims_and_frees():
    """Three tokens sampled at once; the second is a stop token."""
    sched = make_scheduler()
    req = make_request("a", 4, max_tokens=10, stop_token_ids=[5])
    sched.add_request(req)
    out = sched.schedule()
    results = sched.update_from_output(out, {"a": [3, 5, 6]})
    assert len(results) == 1 and results[0].new_token_ids == [3, 5], (
        f"the output must stop at the stop token 5: expected [3, 5], got "
        f"{[r.new_token_ids for r in results]}")
    assert results[0].finish_reason == FinishReason.STOP and results[0].stop_reason == 5
    assert list(req.output_token_ids) == [3, 5], "tokens after the stop are not appended"
    assert running_ids(sched) == [] and "a" not in sched.requests, (
        "a finished request leaves running and the scheduler's requests")
    assert num_free(sched) == 19, "a finished request's blocks are freed at once"


@graded(1, "update_from_output: a request in the middle of its prefill (a non-final chunk) gets "
           "no token and produces no output", f"{DOC}#chunked-prefill")
def test_no_output_for_a_prefill_chunk():
    """An 8-token chunk of a 10-token prompt."""
    sched = make_scheduler(budget=8)
    req = make_request("a", 10)
    engine = Engine(sched)
    engine.add(req)
    _, results = engine.step()
    assert results == [], f"a prefill chunk produces no output, got {results}"
    assert req.num_output_tokens == 0 and req.num_computed_tokens == 8
    _, results = engine.step()
    assert [r.request_id for r in results] == ["a"] and req.num_output_tokens == 1
