"""What lab-10's tests share in the judge: the oracle tokenizer, strategies, the doc links."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from grading.suite import learner_module, load_impl
from tests.labs.common import plain_data
from tests.labs.lab_10.learner_side import MULTI_BYTE_TEXTS, ToyTokenizer

DOC = "phases/06-serving/README.md"
DETOK = f"{DOC}#text-one-step-at-a-time"
STOPS = f"{DOC}#stop-strings-across-tokens"
FINISH = f"{DOC}#finishing-here-aborting-there"
LOGPROBS = f"{DOC}#logprobs-ride-along"

#: The oracle: the same toy tokenizer the learner's code gets; its ``decode`` of a whole
#: sequence is what the streamed deltas must add up to.
TOK = ToyTokenizer()

#: Pieces of text the random texts are made of: every character of the multi-byte texts, and
#: a few ASCII words.
SEGMENTS = sorted(
    {ch for text in MULTI_BYTE_TEXTS for ch in text}
    | {"Hello", " world", " the", ",", "\n", "a", "b", "c", "d", "!", " "}
)


class _DataOnly:
    """The learner-side helpers, whose every result is read through :func:`plain_data`: texts,
    token ids and reasons come back as values, so no learner code answers the checks on them."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        helper = getattr(self._module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return plain_data(helper(*args, **kwargs), f"what {name} gave back")

        return call


def side() -> Any:
    """The suite's helpers in the learner process (after loading the learner's file, so that
    a missing or broken file is reported as such)."""
    load_impl("output_processor")
    return _DataOnly(learner_module("learner_side"))


@st.composite
def split(draw: st.DrawFn, text: str) -> list[int]:
    """One random tokenization of ``text``: at each byte, any token that matches there, so a
    character may come whole, as head + tail, byte by byte, or glued to its neighbour."""
    data, pos, ids = text.encode(), 0, []
    while pos < len(data):
        token = draw(st.sampled_from(TOK.candidates(data, pos)), label="token")
        ids.append(token)
        pos += len(TOK.token_bytes(token))
    return ids


texts = st.lists(st.sampled_from(SEGMENTS), max_size=12).map("".join)


@st.composite
def token_sequences(draw: st.DrawFn, random_ids: bool = True) -> list[int]:
    """Random tokenizations of random multi-byte text, with (``random_ids``) arbitrary token
    ids among them: stray bytes, EOS, characters cut anywhere."""
    parts: list[int] = []
    for _ in range(draw(st.integers(0, 4), label="pieces")):
        if random_ids and draw(st.booleans()):
            parts += draw(
                st.lists(st.integers(0, TOK.vocab_size - 1), min_size=1, max_size=3),
                label="random ids",
            )
        else:
            parts += draw(split(draw(texts, label="text")))
    return parts


@st.composite
def chunked(draw: st.DrawFn, ids: list[int]) -> list[list[int]]:
    """``ids`` cut into steps of random sizes (at least one step, maybe empty)."""
    cuts = draw(st.lists(st.integers(0, len(ids)), max_size=6), label="step boundaries")
    bounds = sorted(set(cuts) | {len(ids)})
    chunks, start = [], 0
    for end in bounds:
        chunks.append(ids[start:end])
        start = end
    return chunks


def show(ids: list[int]) -> str:
    """Token ids with their bytes, for a message: ``[12:b'\\xf0\\x9f', 40:b'\\x98\\x80']``."""
    shown = [f"{t}:EOS" if t == 0 else f"{t}:{TOK.token_bytes(t)!r}" for t in ids[:12]]
    return "[" + ", ".join(shown) + (", ...]" if len(ids) > 12 else "]")
