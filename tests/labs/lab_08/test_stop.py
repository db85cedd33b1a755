"""lab-08, part 1: when a request stops (check_stop), and applying a step's output."""

from __future__ import annotations

from typing import Any

from grading.remote import LearnerError
from grading.suite import graded, learner_module
from mini_vllm.request import FinishReason, RequestStatus
from tests.labs.lab_08.helpers import BS, DOC, Engine, scheduler_module


def request(rid: str, num_prompt: int, **kwargs: Any) -> Any:
    """A request built in the learner process (prompt 0, 1, ...); kwargs as for
    ``learner_side.make_request`` (max_tokens, eos, generation_eos, sampling parameters)."""
    return learner_module("learner_side").make_request(rid, list(range(num_prompt)), BS, **kwargs)


def appended(req: Any, *tokens: int, max_model_len: int = 64) -> tuple[list[bool], dict]:
    """Append tokens one at a time; check_stop's answer after each, and the request after."""
    answers, info = learner_module("learner_side").check_stop(
        scheduler_module(), req, list(tokens), max_model_len
    )
    for answer in answers:
        if type(answer) is not bool:
            raise AssertionError(f"check_stop must return True or False, returned {answer!r}")
    return answers, info


@graded(
    2,
    "Stop conditions: the EOS token ends the request as FINISHED_STOPPED (finish reason "
    "'stop'), with no stop_reason",
    f"{DOC}#stop-conditions",
)
def test_eos_stops():
    """EOS is 7: the request stops on the first 7."""
    answers, info = appended(request("a", 4, max_tokens=10, eos=7), 3, 7)
    assert answers == [False, True], f"check_stop must answer True on EOS only, got {answers}"
    assert info["status"] is RequestStatus.FINISHED_STOPPED, f"status is {info['status']}"
    assert info["stop_reason"] is None, (
        f"EOS leaves stop_reason None (it records stop tokens), got {info['stop_reason']!r}"
    )


@graded(
    2,
    "Stop conditions: ignore_eos ignores only EOS; stop_token_ids still end the request, "
    "and the stop token is recorded as stop_reason",
    f"{DOC}#stop-conditions",
)
def test_stop_tokens_apply_even_with_ignore_eos():
    """ignore_eos with EOS 7 and stop token 9: 7 goes on, 9 stops."""
    # Built as the engine builds it: the model's EOS is recorded in the sampling parameters
    # (all_stop_token_ids holds it even under ignore_eos: that set is for min_tokens masking).
    req = request(
        "a", 4, max_tokens=10, eos=7, generation_eos=7, ignore_eos=True, stop_token_ids=[9]
    )
    answers, info = appended(req, 7, 7, 9)
    assert answers == [False, False, True], (
        f"under ignore_eos the EOS token (7) must not stop the request, but the stop token 9 "
        f"must: expected [False, False, True], got {answers}"
    )
    assert info["status"] is RequestStatus.FINISHED_STOPPED and info["stop_reason"] == 9, (
        f"a stop token ends the request as FINISHED_STOPPED with stop_reason 9; got "
        f"{info['status']}, stop_reason {info['stop_reason']!r}"
    )


@graded(
    2,
    "Stop conditions: max_tokens outputs end the request (FINISHED_LENGTH_CAPPED) on the "
    "max_tokens-th token, not one before or after",
    f"{DOC}#stop-conditions",
)
def test_max_tokens_stops_exactly():
    """max_tokens 3: the third output ends it."""
    answers, info = appended(request("a", 4, max_tokens=3), 1, 2, 3)
    assert answers == [False, False, True], (
        f"with max_tokens=3, check_stop answers False, False, True for the 1st, 2nd, 3rd token; "
        f"got {answers}"
    )
    assert info["status"] is RequestStatus.FINISHED_LENGTH_CAPPED, f"status is {info['status']}"


@graded(
    1,
    "Stop conditions: a request whose tokens reach max_model_len is FINISHED_LENGTH_CAPPED "
    "(the KV cache has no room beyond); max_tokens=None is resolved by add_request into "
    "request.max_tokens (the room max_model_len leaves): read that, not sampling_params",
    f"{DOC}#stop-conditions",
)
def test_max_model_len_stops():
    """60 prompt tokens and max_model_len 64: the 4th output ends it, with max_tokens 50 or
    None."""
    answers, info = appended(request("a", 60, max_tokens=50), 1, 2, 3, 4)
    assert answers == [False, False, False, True], (
        f"at 64 tokens (max_model_len) the request must stop; got {answers}"
    )
    assert info["status"] is RequestStatus.FINISHED_LENGTH_CAPPED, f"status is {info['status']}"
    # max_tokens=None: add_request (given) sets request.max_tokens to the room left, 4.
    side = learner_module("learner_side")
    req = request("b", 60, max_tokens=None)
    side.make_scheduler(20, BS, 64, 16, 4).add_request(req)
    try:
        answers, info = appended(req, 1, 2, 3, 4)
    except LearnerError as exc:
        raise AssertionError(
            "with max_tokens=None, compare with request.max_tokens, which add_request set to "
            "the room max_model_len leaves (4 here); sampling_params.max_tokens stays None. "
            f"check_stop raised {getattr(exc, 'display', exc)}"
        ) from None
    assert answers == [False, False, False, True], (
        f"max_tokens=None, 60 prompt tokens, max_model_len 64: the 4th output ends the request; "
        f"check_stop answered {answers}"
    )
    assert info["status"] is RequestStatus.FINISHED_LENGTH_CAPPED, f"status is {info['status']}"


@graded(
    1,
    "Stop conditions: nothing stops a request before min_tokens outputs, neither EOS, a "
    "stop token nor a repeated pattern (and one sampled then does not stop a later token: "
    "only the token just appended is judged); then EOS is checked first, stop tokens next, "
    "the length limits only after them",
    f"{DOC}#stop-conditions",
)
def test_min_tokens_and_the_order_of_checks():
    """min_tokens 3 defers EOS, min_tokens 2 a stop token (one sampled early stops nothing
    later), min_tokens 4 a repetition; EOS that is also a stop token is reported as EOS; EOS or
    a stop token on the max_tokens-th output is reported as a stop."""
    answers, _ = appended(request("a", 4, max_tokens=10, eos=7, min_tokens=3), 7, 7, 7)
    assert answers == [False, False, True], f"EOS counts only from the 3rd output, got {answers}"
    answers, _ = appended(request("s", 4, max_tokens=10, stop_token_ids=[9], min_tokens=2), 9, 9)
    assert answers == [False, True], (
        f"min_tokens 2 defers stop tokens too: the stop token 9 counts only from the 2nd output; "
        f"check_stop answered {answers}"
    )
    for rid, kwargs, what in (
        ("a2", {"eos": 7}, "EOS 7"),
        ("s2", {"stop_token_ids": [7]}, "the stop token 7"),
    ):
        answers, _ = appended(request(rid, 4, max_tokens=10, min_tokens=2, **kwargs), 7, 1, 2)
        assert answers == [False, False, False], (
            f"min_tokens 2, outputs 7 1 2: {what} came as the 1st output (deferred), and the "
            f"2nd and 3rd are ordinary tokens, so nothing stops; check_stop answered {answers} "
            f"(judge only the token just appended, output_token_ids[-1], not every output)"
        )
    answers, _ = appended(
        request("r", 4, max_tokens=10, min_tokens=4, repetition=(2, 1, 2)), 4, 4, 4, 4
    )
    assert answers == [False, False, False, True], (
        f"min_tokens 4 defers repetition_detection too: 4 4 is a repeated pattern from the 2nd "
        f"output on, but it may end the request only from the 4th; check_stop answered "
        f"{answers} (return False before any check while num_output_tokens < min_tokens)"
    )
    answers, info = appended(request("b", 4, max_tokens=10, eos=7, stop_token_ids=[7]), 7)
    assert answers == [True], f"EOS stops the request, got {answers}"
    assert info["stop_reason"] is None, "EOS is checked first: no stop_reason for it"
    for rid, kwargs, reason in (("e", {"eos": 7}, None), ("t", {"stop_token_ids": [7]}, 7)):
        answers, info = appended(request(rid, 4, max_tokens=2, **kwargs), 1, 7)
        assert answers == [False, True], f"max_tokens 2: the 2nd output ends it, got {answers}"
        what = "EOS" if reason is None else "the stop token 7"
        assert (info["status"], info["stop_reason"]) == (RequestStatus.FINISHED_STOPPED, reason), (
            f"the 2nd output is both {what} and the max_tokens-th token: EOS and stop tokens are "
            f"checked before the length limits, so the status is FINISHED_STOPPED with "
            f"stop_reason {reason!r}; got {info['status'].name}, stop_reason "
            f"{info['stop_reason']!r}"
        )


@graded(
    2,
    "Stop conditions: with repetition_detection, an output ending in a pattern of "
    "min..max_pattern_size tokens repeated min_count times stops the request "
    "(FINISHED_REPETITION, stop_reason 'repetition_detected'), checked after the length "
    "limits",
    f"{DOC}#stop-conditions",
)
def test_repetition_stops_the_request():
    """Patterns of 2 or 3 tokens, 3 times: 1 2 1 2 1 2 stops on its 6th token."""
    answers, info = appended(
        request("a", 4, max_tokens=20, repetition=(3, 2, 3)), 5, 5, 5, 1, 2, 1, 2, 1, 2
    )
    assert answers == [False] * 8 + [True], (
        "5 5 5 is a 1-token pattern, shorter than min_pattern_size 2: no stop; 1 2 1 2 1 2 is a "
        f"2-token pattern seen 3 times: stop on its last token. check_stop answered {answers}"
    )
    assert info["status"] is RequestStatus.FINISHED_REPETITION, f"status is {info['status']}"
    assert info["stop_reason"] == "repetition_detected", (
        f"stop_reason must be 'repetition_detected', got {info['stop_reason']!r}"
    )
    answers, info = appended(request("b", 4, max_tokens=6, repetition=(3, 2, 3)), 1, 2, 1, 2, 1, 2)
    assert answers[-1] is True and info["status"] is RequestStatus.FINISHED_LENGTH_CAPPED, (
        "the 6th token is both the max_tokens-th and a repetition: the length limit is checked "
        f"first, so the status is FINISHED_LENGTH_CAPPED; got {info['status']}"
    )
    answers, _ = appended(request("c", 4, max_tokens=20, repetition=(2, 1, 2)), 4, 4)
    assert answers == [False, True], (
        f"min_pattern_size 1, min_count 2: 4 4 stops on the second 4, got {answers}"
    )
    answers, _ = appended(request("d", 3, max_tokens=20, repetition=(3, 2, 3)), 1, 2, 1, 2, 1, 2)
    assert answers == [False] * 5 + [True], (
        "only the output counts: the prompt 0 1 2 followed by 1 2 1 2 ends in 1 2 three times, "
        "but the output holds it twice; the 6th output completes it. check_stop answered "
        f"{answers} (look for the pattern in request.output_token_ids, not all_token_ids)"
    )


@graded(
    2,
    "update_from_output appends the sampled tokens one by one and stops at the first "
    "stop: the output is trimmed after it, the request is freed and leaves running",
    f"{DOC}#finishing-and-freeing",
)
def test_update_from_output_trims_and_frees():
    """Three tokens sampled at once; the second is a stop token."""
    engine = Engine()
    engine.add("a", 4, max_tokens=10, stop_token_ids=[5])
    engine.schedule()
    results = engine.update({"a": [3, 5, 6]})
    assert [(r.request_id, r.new_token_ids) for r in results] == [("a", [3, 5])], (
        f"the output must stop at the stop token 5: expected a: [3, 5], got "
        f"{[(r.request_id, r.new_token_ids) for r in results]}"
    )
    assert results[0].finish_reason == FinishReason.STOP and results[0].stop_reason == 5, (
        f"finish reason stop, stop_reason 5; got {results[0].finish_reason}, "
        f"{results[0].stop_reason!r}"
    )
    info = engine.info("a")
    assert info["output_token_ids"] == [3, 5], (
        f"tokens after the stop are not appended: a's outputs are {info['output_token_ids']}"
    )
    assert engine.running == [] and "a" not in engine.state["requests"], (
        "a finished request leaves running and the scheduler's requests"
    )
    assert engine.num_free() == 19, "a finished request's blocks are freed at once"


@graded(
    1,
    "update_from_output: a request in the middle of its prefill (a non-final chunk) gets "
    "no token and produces no output",
    f"{DOC}#chunked-prefill",
)
def test_no_output_for_a_prefill_chunk():
    """An 8-token chunk of a 10-token prompt."""
    engine = Engine(budget=8)
    engine.add("a", 10)
    _, results = engine.step()
    assert results == [], f"a prefill chunk produces no output, got {results}"
    info = engine.info("a")
    assert info["output_token_ids"] == [] and info["num_computed_tokens"] == 8, info
    _, results = engine.step()
    assert [r.request_id for r in results] == ["a"], results
    assert len(engine.info("a")["output_token_ids"]) == 1
