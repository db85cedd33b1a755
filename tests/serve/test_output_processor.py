"""``OutputProcessor`` alone: finish reasons, stop strings and the abort bookkeeping.

No server, no sockets: engine-core outputs are made by hand. The rule under test is that a
request id is tracked from ``add_request`` until exactly one of (the core finished it, a stop
string finished it, the client aborted it), and that outputs still on the wire for an id that is
gone are ignored.
"""

from __future__ import annotations

import pytest

from mini_vllm.engine import EngineCoreEvent, EngineCoreEventType
from mini_vllm.engine.core import EngineCoreOutput, EngineCoreRequest, EngineCoreSamplingParams
from mini_vllm.engine.output_processor import OutputProcessor
from mini_vllm.metrics.stats import IterationStats, ParentRequestStats


@pytest.fixture()
def processor(serve_tokenizer) -> OutputProcessor:
    return OutputProcessor(serve_tokenizer)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def _add(processor, request_id: str, **kwargs):
    request = EngineCoreRequest(request_id, [1, 2, 3], EngineCoreSamplingParams())
    return processor.add_request(request, "prompt", arrival_time=0.0, **kwargs)


def _drain(queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def test_streamed_deltas_then_finish(processor, serve_tokenizer):
    queue = _add(processor, "a", stream=True)
    ids = _ids(serve_tokenizer, "Hello there, world")
    stats = IterationStats()
    processor.process_outputs([EngineCoreOutput("a", ids[:2])], now=1.0, iteration_stats=stats)
    processor.process_outputs(
        [EngineCoreOutput("a", ids[2:], finish_reason="length")], now=1.5, iteration_stats=stats
    )
    outs = _drain(queue)
    assert "".join(o.outputs[0].text for o in outs) == "Hello there, world"
    assert [o.finished for o in outs] == [False, True]
    assert outs[-1].outputs[0].finish_reason == "length"
    assert not processor.has_unfinished_requests()
    assert stats.time_to_first_tokens_iter == [1.0]
    assert stats.inter_token_latencies_iter == [0.5]
    (finished,) = stats.finished_requests
    assert finished.num_generation_tokens == len(ids) and finished.e2e_latency == 1.5
    assert finished.queued_time is None, "no core stamps arrived: no phases to report"


def test_the_phases_come_from_the_cores_stamps(processor, serve_tokenizer):
    """Upstream's four phases of a finished request: queued (QUEUED to the first SCHEDULED),
    prefill (to the first token), decode (first to last token), inference (first SCHEDULED to
    the last token); a resume's SCHEDULED starts nothing. The first output's prefix hits become
    the iteration's cached prompt tokens."""
    _add(processor, "a")
    ids = _ids(serve_tokenizer, "Hello there, world")
    queued, scheduled, resumed = (
        EngineCoreEvent(EngineCoreEventType.QUEUED, 0.25),
        EngineCoreEvent(EngineCoreEventType.SCHEDULED, 0.5),
        EngineCoreEvent(EngineCoreEventType.SCHEDULED, 1.75),
    )
    first = IterationStats()
    out = EngineCoreOutput("a", ids[:1], events=[queued, scheduled], num_cached_tokens=2)
    processor.process_outputs([out], now=1.0, iteration_stats=first)
    assert first.num_cached_tokens == 2 and first.num_prompt_tokens == 3
    preempted = EngineCoreEvent(EngineCoreEventType.PREEMPTED, 1.5)
    out = EngineCoreOutput("a", ids[1:2], events=[preempted, resumed])
    processor.process_outputs([out], now=2.0, iteration_stats=IterationStats())
    last = IterationStats()
    out = EngineCoreOutput("a", ids[2:], finish_reason="length")
    processor.process_outputs([out], now=3.0, iteration_stats=last)
    (finished,) = last.finished_requests
    phases = (finished.queued_time, finished.prefill_time, finished.decode_time)
    assert phases == (0.25, 0.5, 2.0) and finished.inference_time == 2.5
    assert finished.num_cached_tokens == 2 and finished.max_tokens_param == 16


def test_non_streaming_gets_the_whole_text(processor, serve_tokenizer):
    queue = _add(processor, "a", stream=False)
    ids = _ids(serve_tokenizer, "one two three")
    processor.process_outputs([EngineCoreOutput("a", ids[:1])])
    processor.process_outputs([EngineCoreOutput("a", ids[1:], finish_reason="length")])
    outs = _drain(queue)
    assert outs[-1].outputs[0].text == "one two three"
    assert outs[-1].outputs[0].token_ids == ids


def test_the_token_that_stopped_the_core_is_not_text(processor, serve_tokenizer):
    # A stop token id (or EOS) ends the request in the core: as upstream, it is counted as an
    # output token but its text is left out.
    queue = _add(processor, "a")
    ids = _ids(serve_tokenizer, "one two three")
    processor.process_outputs(
        [EngineCoreOutput("a", ids, finish_reason="stop", stop_reason=ids[-1])]
    )
    (out,) = _drain(queue)
    assert out.outputs[0].text == serve_tokenizer.decode(ids[:-1])
    assert out.outputs[0].token_ids == ids and out.outputs[0].stop_reason == ids[-1]


def test_stop_string_finishes_here_and_asks_the_core_to_abort(processor, serve_tokenizer):
    queue = _add(processor, "a", stream=True, stop=["END"])
    ids = _ids(serve_tokenizer, "some text END more text")
    result = processor.process_outputs([EngineCoreOutput("a", ids)])
    assert result.reqs_to_abort == ["a"]
    (out,) = _drain(queue)
    assert out.finished and out.outputs[0].text == "some text "
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", "END")
    # The core's next step crossed the abort: ignored, nothing more is queued.
    assert processor.process_outputs([EngineCoreOutput("a", ids[:1])]).reqs_to_abort == []
    assert queue.empty() and not processor.has_unfinished_requests()


def test_stop_string_found_on_the_core_s_last_step_needs_no_abort(processor, serve_tokenizer):
    _add(processor, "a", stop=["END"])
    ids = _ids(serve_tokenizer, "x END")
    result = processor.process_outputs([EngineCoreOutput("a", ids, finish_reason="length")])
    assert result.reqs_to_abort == []


def test_abort_forgets_the_request_once(processor, serve_tokenizer):
    queue = _add(processor, "a", stream=True)
    _add(processor, "b", stream=True)
    assert processor.abort_requests(["a", "zzz"]) == ["a"]
    assert processor.abort_requests(["a"]) == []
    processor.process_outputs([EngineCoreOutput("a", _ids(serve_tokenizer, "late"))])
    assert queue.empty()
    assert processor.get_num_unfinished_requests() == 1


def test_core_refusal_and_engine_death_reach_the_waiting_handlers(processor):
    queue_a = _add(processor, "a")
    queue_b = _add(processor, "b")
    processor.process_outputs([EngineCoreOutput("a", [], finish_reason="error", error="no")])
    (error,) = _drain(queue_a)
    assert isinstance(error, ValueError) and str(error) == "no"
    processor.propagate_error(RuntimeError("dead"))
    (dead,) = _drain(queue_b)
    assert isinstance(dead, RuntimeError)
    assert not processor.has_unfinished_requests()


def test_duplicate_request_id_is_refused(processor):
    _add(processor, "a")
    with pytest.raises(ValueError, match="already in use"):
        _add(processor, "a")


def test_no_stop_string_within_min_tokens(processor, serve_tokenizer):
    # As upstream's detokenizer (vllm/v1/engine/detokenizer.py, BaseIncrementalDetokenizer.update):
    # stop strings are not looked for until min_tokens tokens are out, nor in those tokens' text.
    ids = _ids(serve_tokenizer, "one END two END three")
    first_end = next(i for i in range(len(ids)) if "END" in serve_tokenizer.decode(ids[: i + 1]))
    request = EngineCoreRequest("a", [1, 2, 3], EngineCoreSamplingParams(min_tokens=first_end + 1))
    queue = processor.add_request(request, "prompt", arrival_time=0.0, stop=["END"])
    # The first END arrives within min_tokens, in the same step as the tokens after it.
    result = processor.process_outputs([EngineCoreOutput("a", ids)])
    assert result.reqs_to_abort == ["a"]
    (out,) = _drain(queue)
    assert out.outputs[0].text == "one END two "
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", "END")


def test_min_tokens_reached_lets_stop_strings_through(processor, serve_tokenizer):
    ids = _ids(serve_tokenizer, "one END two")
    request = EngineCoreRequest("a", [1, 2, 3], EngineCoreSamplingParams(min_tokens=1))
    queue = processor.add_request(request, "prompt", arrival_time=0.0, stop=["END"])
    processor.process_outputs([EngineCoreOutput("a", ids[:1])])
    assert processor.process_outputs([EngineCoreOutput("a", ids[1:])]).reqs_to_abort == ["a"]
    assert _drain(queue)[-1].outputs[0].text == "one "


def test_a_prompts_samples_are_recorded_once_all_finished(processor, serve_tokenizer):
    """The server's ``n`` samples of one prompt share a ``ParentRequestStats``: ``n`` and the
    longest sample's token count are recorded once, when the last sample finishes (upstream's
    ``ParentRequest.observe_finished_request``); a request without one counts as ``n = 1``."""
    parent = ParentRequestStats(2)
    _add(processor, "a-0", parent=parent)
    _add(processor, "a-1", parent=parent)
    _add(processor, "b")
    ids = _ids(serve_tokenizer, "one two three")
    first, second = IterationStats(), IterationStats()
    outs = [
        EngineCoreOutput("a-0", ids, finish_reason="length"),
        EngineCoreOutput("b", ids[:1], finish_reason="stop"),
        EngineCoreOutput("a-1", ids[:1]),
    ]
    processor.process_outputs(outs, now=1.0, iteration_stats=first)
    assert (first.n_params_iter, first.max_num_generation_tokens_iter) == ([1], [1])
    processor.process_outputs(
        [EngineCoreOutput("a-1", ids[1:2], finish_reason="length")], now=2.0, iteration_stats=second
    )
    assert (second.n_params_iter, second.max_num_generation_tokens_iter) == ([2], [len(ids)])
