"""What lab-10's tests share in the judge: the oracle tokenizer, strategies, the doc links."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from grading.suite import learner_module, load_impl
from tests.labs.common import plain_data
from tests.labs.lab_10.learner_side import MULTI_BYTE_TEXTS, ToyTokenizer, run_detokenizer

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


def reference_steps(prompt_ids: list[int], chunks: list[list[int]], **options: Any) -> list[Any]:
    """The reference detokenizer (``mini_vllm.engine.detokenizer``), here in the judge, fed
    ``chunks`` by ``learner_side.run_detokenizer`` (``options`` are its own), the function that
    feeds the learner's: one record per step, ``{"delta", "text", "stop"}``, the yardstick of
    what each step hands out."""
    from mini_vllm.engine.detokenizer import IncrementalDetokenizer

    run = run_detokenizer(prompt_ids, chunks, **options, detokenizer_class=IncrementalDetokenizer)
    return run["steps"]


def check_each_step(
    got: list[dict[str, Any]], want: list[dict[str, Any]], where: str, doc: str
) -> None:
    """Every step's handed-out text (``delta`` and the whole text so far) and ``update``'s
    answer equal the reference's on the same steps: text is handed out as soon as it is final,
    and held back only while it may still be an incomplete character or begin a stop string.
    ``doc`` is the section of the README that the message points to."""
    for i, (mine, ref) in enumerate(zip(got, want, strict=False)):
        last = i == len(want) - 1
        assert mine == ref, (
            f"{where}: step {i + 1} of {len(want)}{' (the finish)' if last else ''} must hand "
            f"out delta {ref['delta']!r} (text so far {ref['text']!r}, update returned "
            f"{ref['stop']!r}), as the reference detokenizer does on the same steps; got delta "
            f"{mine.get('delta')!r} (text so far {mine.get('text')!r}, update returned "
            f"{mine.get('stop')!r}). A step hands out every character that is final: it holds "
            f"back only a trailing incomplete character (U+FFFD) and, until the finish, the last "
            f"len(longest stop) - 1 characters, which may begin a stop string (none without stop "
            f"strings; read {doc})"
        )
    assert len(got) == len(want), (
        f"{where}: the reference detokenizer ran {len(want)} steps (a step whose update "
        f"returns a stop string is the last), yours {len(got)}"
    )
