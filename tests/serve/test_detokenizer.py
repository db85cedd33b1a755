"""The incremental detokenizer against the tokenizer's own decode of the whole sequence.

Random token sequences drawn from SmolLM2's byte-level vocabulary, weighted towards the tokens of
multi-byte text (CJK, Cyrillic, accents, emoji), whose characters are split over several tokens:
fed in random step-sized chunks, the streamed deltas must add up to exactly what
``tokenizer.decode`` makes of the whole sequence, and stop strings must cut the text at their
first occurrence, wherever the token boundaries fall.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm.engine.detokenizer import IncrementalDetokenizer, check_stop_strings

MULTI_BYTE_TEXTS = [
    "日本語のテキストです。",
    "café naïve façade",
    "😀🎉👍🏽 emoji!",
    "Привет, мир",
    "한국어 문장",
    "∑∫√∞ ≠ ≤",
    "中文字符和標點，",
    " plain ascii text\n\n",
]
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def token_pool(serve_tokenizer) -> list[int]:
    pool: set[int] = set()
    for text in MULTI_BYTE_TEXTS:
        pool.update(serve_tokenizer(text, add_special_tokens=False).input_ids)
    return sorted(pool)


def token_sequences(pool: list[int], vocab_size: int) -> st.SearchStrategy[list[int]]:
    token = st.one_of(
        st.sampled_from(pool),  # pieces of multi-byte characters
        st.integers(0, vocab_size - 1),  # anything, special tokens included
    )
    return st.lists(token, min_size=0, max_size=40)


def _run(detok: IncrementalDetokenizer, ids: list[int], cuts: list[int]) -> tuple[str, str | None]:
    """Feed ``ids`` in chunks ending at ``cuts``; return the streamed text and the stop hit."""
    streamed = ""
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {len(ids)})
    start = 0
    for end in bounds:
        finished = end == len(ids)
        stop = detok.update(ids[start:end], finished=finished)
        start = end
        finished = finished or stop is not None
        streamed += detok.get_next_output_text(finished, delta=True)
        if stop is not None:
            return streamed, stop
    return streamed, None


@given(data=st.data())
@SETTINGS
def test_streamed_deltas_equal_full_decode(serve_tokenizer, token_pool, data):
    ids = data.draw(token_sequences(token_pool, len(serve_tokenizer)))
    cuts = data.draw(st.lists(st.integers(0, 50), max_size=10))
    skip = data.draw(st.booleans())
    detok = IncrementalDetokenizer(serve_tokenizer, skip_special_tokens=skip)
    streamed, _ = _run(detok, ids, cuts)
    expected = serve_tokenizer.decode(ids, skip_special_tokens=skip)
    assert streamed == expected
    assert detok.output_text == expected


@given(data=st.data())
@SETTINGS
def test_prompt_context_does_not_leak_into_output(serve_tokenizer, token_pool, data):
    prompt = serve_tokenizer("Translate: ", add_special_tokens=False).input_ids
    ids = data.draw(token_sequences(token_pool, len(serve_tokenizer)))
    detok = IncrementalDetokenizer(serve_tokenizer, prompt)
    streamed, _ = _run(detok, ids, data.draw(st.lists(st.integers(0, 50), max_size=10)))
    assert streamed == serve_tokenizer.decode(ids, skip_special_tokens=True)


@given(data=st.data())
@SETTINGS
def test_stop_strings_cut_at_first_occurrence(serve_tokenizer, token_pool, data):
    text = data.draw(st.sampled_from(MULTI_BYTE_TEXTS))
    ids = serve_tokenizer(text * 2, add_special_tokens=False).input_ids
    full = serve_tokenizer.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = full[start : start + data.draw(st.integers(1, 4))]
    include = data.draw(st.booleans())
    detok = IncrementalDetokenizer(serve_tokenizer, stop=[stop], include_stop_str_in_output=include)
    streamed, hit = _run(detok, ids, data.draw(st.lists(st.integers(0, 50), max_size=10)))
    assert hit == stop
    index = full.find(stop)
    expected = full[: index + len(stop)] if include else full[:index]
    assert detok.output_text == expected
    assert streamed == expected  # nothing past the stop string ever reached the client


def test_split_character_is_held_back_until_complete(serve_tokenizer):
    ids = serve_tokenizer("😀", add_special_tokens=False).input_ids
    assert len(ids) > 1, "the emoji should span several byte-level tokens"
    detok = IncrementalDetokenizer(serve_tokenizer)
    for token in ids[:-1]:
        detok.update([token])
        assert detok.get_next_output_text(False, delta=True) == ""
    detok.update(ids[-1:], finished=True)
    assert detok.get_next_output_text(True, delta=True) == "😀"


def test_check_stop_strings_semantics():
    # Only matches that the new characters complete count; the earliest-starting one wins.
    assert check_stop_strings("abc STOP", 4, ["STOP"], False) == ("STOP", 4)
    assert check_stop_strings("abc STOP", 2, ["STOP"], True) == ("STOP", -1)
    assert check_stop_strings("abc STOP tail", 4, ["STOP"], True) is None
    assert check_stop_strings("xx ab cd", 3, ["cd", "ab c"], False) == ("ab c", 3)
    assert check_stop_strings("anything", 0, ["any"], False) is None
