"""lab-10's helpers in the learner process, and the toy tokenizer both processes share.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. Nothing here
decides anything: the helpers build the tokenizer and the objects the learner's code receives,
run the step sequences the tests dictate, and return what they read as plain data.

``ToyTokenizer`` is a byte-level vocabulary small enough to read, built without files or
network, so that the lab needs neither ``transformers`` nor a downloaded model. Like SmolLM2's
(GPT-2 style) vocabulary, a token is a run of *bytes*: all 256 single bytes, whole words, whole
multi-byte characters, and pieces of characters (the first two bytes of an emoji, the tail of
one CJK character glued to the head of the next), so a character is often split over tokens.
``decode`` joins the bytes and decodes them as UTF-8 with ``errors="replace"``, which is what a
byte-level tokenizer's decoder does: an incomplete character becomes U+FFFD. The judge imports
the same class as the oracle (its ``decode`` of the whole sequence).
"""

from __future__ import annotations

import asyncio
import collections
import types
from collections.abc import Sequence
from typing import Any

EOS_TOKEN = "<|endoftext|>"

#: Multi-byte text whose characters the vocabulary splits in several ways.
MULTI_BYTE_TEXTS = [
    "日本語のテキスト。",
    "café naïve",
    "😀🎉👍🏽!",
    "Привет, мир",
    "한국어",
    "∑√∞ ≠ ≤",
]
_WORDS = [
    "Hello",
    " world",
    " the",
    " there",
    ",",
    ".",
    "\n\n",
    "\n",
    "Question",
    ":",
    " STOP",
    "ST",
    "OP",
    " end",
    "!!",
    "ab",
    "cd",
    "ef",
]


def _vocabulary() -> list[bytes]:
    """Id 0 is EOS (special); ids 1 .. 256 the single bytes; then the merged pieces."""
    pieces: list[bytes] = [bytes([b]) for b in range(256)]
    extra: list[bytes] = [w.encode() for w in _WORDS]
    for text in MULTI_BYTE_TEXTS:
        for ch in text:
            raw = ch.encode()
            extra.append(raw)  # the whole character
            if len(raw) >= 3:
                extra.append(raw[:2])  # its head ...
                extra.append(raw[2:])  # ... and its tail
        data = text.encode()
        for i in range(0, len(data) - 3, 3):  # windows that straddle character boundaries
            extra.append(data[i + 1 : i + 4])
    seen: set[bytes] = set(pieces)
    for piece in extra:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return pieces


class ToyTokenizer:
    """A byte-level tokenizer: ``decode`` is the only method the output processor uses.

    ``leading_space_rule``: decode like a SentencePiece vocabulary (Llama 2), which drops the
    leading space of the first word of the decoded text: ``" world"`` alone decodes to
    ``"world"``, after ``"Question:"`` to ``" world"``. A token's text then depends on what
    precedes it, which is why the detokenizer decodes a window with context, never a token
    alone. ``decoded_tokens`` counts the tokens passed to ``decode``, the cost of detokenizing.
    """

    eos_token_id = 0

    def __init__(self, leading_space_rule: bool = False) -> None:
        self.leading_space_rule = leading_space_rule
        self.decoded_tokens = 0
        self.pieces: list[bytes] = _vocabulary()  # token id i + 1 -> pieces[i]
        self.vocab_size = len(self.pieces) + 1
        self._by_bytes = {p: i + 1 for i, p in enumerate(self.pieces)}
        self.max_piece_len = max(len(p) for p in self.pieces)

    def token_bytes(self, token_id: int) -> bytes:
        return self.pieces[token_id - 1]

    def token_id(self, piece: bytes) -> int:
        """The id of the token whose bytes are ``piece`` (KeyError if there is none)."""
        return self._by_bytes[piece]

    def candidates(self, data: bytes, pos: int) -> list[int]:
        """Every token whose bytes start ``data`` at ``pos`` (for random tokenizations)."""
        found = []
        for n in range(1, self.max_piece_len + 1):
            token = self._by_bytes.get(data[pos : pos + n])
            if token is not None and pos + n <= len(data):
                found.append(token)
        return found

    def encode(self, text: str) -> list[int]:
        """Greedy longest match (the tests also draw other splits of the same bytes)."""
        data, pos, ids = text.encode(), 0, []
        while pos < len(data):
            token = self.candidates(data, pos)[-1]
            ids.append(token)
            pos += len(self.token_bytes(token))
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Bytes joined and decoded as UTF-8 (``errors="replace"``); EOS as its text or skipped.

        As in Hugging Face tokenizers, a special token ends a byte run: the bytes on either
        side of it are decoded separately.
        """
        self.decoded_tokens += len(token_ids)
        parts: list[str] = []
        run = bytearray()
        for token_id in token_ids:
            token_id = int(token_id)
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is not in the vocabulary")
            if token_id == self.eos_token_id:
                if not skip_special_tokens:
                    parts.append(run.decode("utf-8", errors="replace"))
                    run = bytearray()
                    parts.append(EOS_TOKEN)
                continue
            run += self.token_bytes(token_id)
        parts.append(run.decode("utf-8", errors="replace"))
        text = "".join(parts)
        if self.leading_space_rule and text.startswith(" "):
            text = text[1:]
        return text


def make_tokenizer() -> ToyTokenizer:
    return ToyTokenizer()


# -- the detokenizer alone ----------------------------------------------------------------------
def _holds_exactly(given: list[Any], sent: Sequence[int | str]) -> bool:
    """Whether the list handed to the learner's code still holds what the judge sent (token ids,
    request ids), each compared only as a value of the sent one's exact builtin type: an object
    the learner's code put in the list answers ``==`` as it likes
    (tests/hostile/equal_to_anything_in_the_callers_list.py)."""
    return len(given) == len(sent) and all(
        type(mine) is type(theirs) and mine == theirs for mine, theirs in zip(given, sent)
    )


def _listed(value: Any) -> Any:
    """A list the learner's code holds, as a new plain list, read by ``list``'s own iteration;
    anything but an exact ``list`` comes back as the name of its type, which no test takes for
    the right answer. A ``list`` subclass answers ``__iter__`` as it likes: one that yields what
    the tests expect while its ``len`` and slices (what the output processor reads) keep the bug
    would pass (tests/hostile/count_the_stop_token_only_when_walked.py)."""
    return list(value) if type(value) is list else f"a {type(value).__name__}"


def _tracked(states: Any) -> Any:
    """The sorted keys of ``request_states``, read by ``dict``'s own iteration (an exact ``dict``
    only, as :func:`_listed`): a subclass whose ``__iter__`` left finished requests out passed
    for one that forgets them, while ``len`` and ``bool`` (``has_unfinished_requests``) still
    counted them (tests/hostile/hide_the_finished_from_the_walk.py)."""
    return sorted(states) if type(states) is dict else f"a {type(states).__name__}"


def run_detokenizer(
    prompt_ids: list[int],
    chunks: list[list[int]],
    stop: list[str] | None = None,
    include_stop_str_in_output: bool = False,
    skip_special_tokens: bool = True,
    stop_terminated: bool = False,
    finish: bool = True,
    leading_space_rule: bool = False,
    detokenizer_class: Any = None,
    min_tokens: int = 0,
) -> dict[str, Any]:
    """Feed ``chunks`` one step each, as the output processor does, and record every step.

    The last chunk is sent with ``finished=finish`` (and ``stop_terminated``); a step whose
    ``update`` returns a stop string is the last. Returns, per step, the delta handed out
    (``get_next_output_text(finished, delta=True)``), the whole text so far (``delta=False``)
    and what ``update`` returned; then ``output_text``, ``output_token_ids``, how many
    tokens were decoded in all (``decoded_tokens``) and the steps whose list of new token ids
    ``update`` changed (``inputs_changed``).

    ``detokenizer_class`` is the learner's ``IncrementalDetokenizer`` unless given: the judge
    runs the reference through this same function (``support.reference_steps``); a class never
    crosses to the learner process, so there it is always the learner's.
    """
    if detokenizer_class is None:
        import output_processor

        detokenizer_class = output_processor.IncrementalDetokenizer
    tokenizer = ToyTokenizer(leading_space_rule)
    # Only when asked: a file begun before ``min_tokens`` joined the constructor still loads.
    extra = {"min_tokens": min_tokens} if min_tokens else {}
    detok = detokenizer_class(
        tokenizer,
        prompt_ids,
        skip_special_tokens=skip_special_tokens,
        stop=stop or (),
        include_stop_str_in_output=include_stop_str_in_output,
        **extra,
    )
    steps: list[dict[str, Any]] = []
    # Each list handed to ``update`` is compared with what the judge sent after the whole run,
    # every update and every read done: one kept by the learner's object and changed at a later
    # call is the caller's list changed all the same
    # (tests/hostile/pop_the_stop_token_later.py).
    given_lists: list[tuple[list[int], list[int]]] = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        given = list(chunk)
        given_lists.append((given, chunk))
        found = detok.update(
            given, finished=last and finish, stop_terminated=last and stop_terminated
        )
        finished = (last and finish) or found is not None
        text = detok.get_next_output_text(finished, delta=False)
        delta = detok.get_next_output_text(finished, delta=True)
        steps.append({"delta": delta, "text": text, "stop": found})
        if found is not None:
            break
    result = {
        "steps": steps,
        "output_text": detok.output_text,
        "output_token_ids": _listed(detok.output_token_ids),
        "decoded_tokens": tokenizer.decoded_tokens,
    }
    result["inputs_changed"] = [
        i + 1 for i, (given, chunk) in enumerate(given_lists) if not _holds_exactly(given, chunk)
    ]
    return result


def check_stop_strings(
    output_text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> Any:
    """The learner's ``check_stop_strings``, its answer as a list (or None)."""
    import output_processor

    found = output_processor.check_stop_strings(
        output_text, new_char_count, stop, include_in_output
    )
    return None if found is None else list(found)


def search_a_long_text(num_chars: int, calls: int) -> list[Any]:
    """``calls`` calls of the learner's ``check_stop_strings`` on one text of ``num_chars``
    characters ending in ``"STOP"``, with 1 to 4 new characters: call ``i`` looks for
    ``f"{i}a"`` and ``"a" * i + "STOP"``, so each call asks something new and each answer,
    ``["a" * i + "STOP", num_chars - i]``, is its own (an answer remembered from an earlier
    call of the same text is wrong: tests/hostile/remember_the_long_texts_answer.py). The text
    is built once, before the calls; the judge times the whole request, so a search of the
    whole text, O(num_chars) a call, shows against a search of the tail the new characters
    could have completed."""
    import output_processor

    text = "a" * num_chars + "STOP"
    answers = []
    for i in range(calls):
        # f"{i}a" is never found, and ends in the text's own letter: a search of the whole text
        # cannot skip ahead by the needle's length, as it can for a needle whose last letter
        # the text lacks, so it costs O(the text) a call whatever the search.
        stops = [f"{i}a", "a" * i + "STOP"]
        found = output_processor.check_stop_strings(text, 1 + i % 4, stops, False)
        answers.append(None if found is None else list(found))
    return answers


# -- the output processor -----------------------------------------------------------------------
class CoreOutput:
    """What ``process_outputs`` reads of an ``EngineCoreOutput`` (that one needs pyzmq)."""

    def __init__(
        self,
        request_id: str,
        new_token_ids: list[int],
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        error: str | None = None,
        new_logprobs: list[float] | None = None,
        new_prompt_logprobs: list[list[Any]] | None = None,
    ) -> None:
        self.request_id = request_id
        self.new_token_ids = list(new_token_ids)
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.error = error
        self.new_logprobs = None
        if new_logprobs is not None:
            # One row per new token: the token itself (logprobs=0), with the given logprob.
            from mini_vllm.logprobs import LogprobsLists

            self.new_logprobs = LogprobsLists(
                [[t] for t in self.new_token_ids],
                [[v] for v in new_logprobs],
                [1] * len(self.new_token_ids),
            )
        self.new_prompt_logprobs = None
        if new_prompt_logprobs is not None:
            # One row per prompt token from the second: [token, logprob], ranked first.
            from mini_vllm.logprobs import LogprobsLists

            self.new_prompt_logprobs = LogprobsLists(
                [[t] for t, _ in new_prompt_logprobs],
                [[v] for _, v in new_prompt_logprobs],
                [1] * len(new_prompt_logprobs),
            )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def _builtin_name(exc: BaseException) -> str:
    """The nearest builtin exception class ``exc`` is an instance of, by its real type, never by
    the name the learner's class gives itself: the host's own reading (``wire``, beside it in
    the learner process, where alone this runs)."""
    import wire

    return str(wire.builtin_exception_names(exc)[0])


def _read_output(item: Any) -> dict[str, Any]:
    """A queued item as data: an exception as its builtin type and its ``args``' message
    (``BaseException.__str__``, not the learner class's), a ``RequestOutput`` field by field.
    Its type is read as ``type(item)``: ``isinstance`` would take a ``__class__`` it claims."""
    if issubclass(type(item), BaseException):
        return {"error": f"{_builtin_name(item)}: {BaseException.__str__(item)}"}
    completion = item.outputs[0]
    logprobs = completion.logprobs
    if logprobs is not None and type(logprobs := _listed(logprobs)) is list:
        logprobs = [
            [[t, lp.logprob] for t, lp in position.items()]
            if type(position) is dict
            else f"a {type(position).__name__}"
            for position in logprobs
        ]
    prompt_logprobs = item.prompt_logprobs
    if prompt_logprobs is not None and type(prompt_logprobs := _listed(prompt_logprobs)) is list:
        prompt_logprobs = [
            [[t, lp.logprob] for t, lp in position.items()]
            if type(position) is dict
            else None
            if position is None
            else f"a {type(position).__name__}"
            for position in prompt_logprobs
        ]
    return {
        "request_id": item.request_id,
        "finished": item.finished,
        "text": completion.text,
        "token_ids": _listed(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "stop_reason": completion.stop_reason,
        "logprobs": logprobs,
        "cumulative_logprob": completion.cumulative_logprob,
        "prompt_logprobs": prompt_logprobs,
    }


def _drain(queue: Any) -> list[dict[str, Any]]:
    """Every item on a request's queue, read as data (:func:`_read_output`), taken out by
    ``asyncio.Queue``'s own methods, which read the deque that ``get`` (what a client awaits)
    reads. A queue of another type, or one whose instance overrides a method or holds its items
    in a ``deque`` subclass, can answer ``empty`` and ``get_nowait`` otherwise than ``get``
    (one that hid a repeated final output passed for one queued once:
    tests/hostile/hide_the_second_finish_from_get_nowait.py): it comes back as one error
    entry, which no test takes for the right outputs."""
    plain = (
        type(queue) is asyncio.Queue
        and type(getattr(queue, "_queue", None)) is collections.deque
        and not any(callable(v) for v in vars(queue).values())
    )
    if not plain:
        return [
            {"error": f"add_request returned a {type(queue).__name__}, not a plain asyncio.Queue"}
        ]
    items = []
    while not asyncio.Queue.empty(queue):
        items.append(_read_output(asyncio.Queue.get_nowait(queue)))
    return items


def run_processor(ops: list[list[Any]]) -> list[dict[str, Any]]:
    """Run ``ops`` on one ``OutputProcessor`` over the toy tokenizer; one record per op.

    ``["add", rid, prompt_ids, {"stop": [...], "stream": bool, "logprobs": k, ...}]``,
    ``["step", [[rid, new_token_ids, finish_reason, stop_reason, error, logprobs,
    prompt_logprobs], ...]]`` (the last four optional; ``logprobs``: one float per new token;
    ``prompt_logprobs``: ``[token, logprob]`` per prompt token from the second),
    ``["abort", [rid, ...]]``. Each record has ``returned`` (``reqs_to_abort`` of a step, the
    list ``abort_requests`` returned), ``outputs`` (every ``RequestOutput`` queued since the
    previous op, read as dicts, per request id, in order), ``tracked`` (the sorted keys of
    ``request_states``) and ``input_changed`` (whether ``abort_requests`` changed the list of
    ids it was given).
    """
    import output_processor

    processor = output_processor.OutputProcessor(ToyTokenizer())
    queues: dict[str, asyncio.Queue[Any]] = {}
    records: list[dict[str, Any]] = []
    aborts: list[tuple[int, list[Any], list[Any]]] = []  # (record, the list given, as sent)
    for op in ops:
        name = op[0]
        returned: Any = None
        input_changed = False
        if name == "add":
            _, rid, prompt_ids, options = op
            options = dict(options)
            params = types.SimpleNamespace(
                logprobs=options.pop("logprobs", None),
                prompt_logprobs=options.pop("prompt_logprobs", None),
                min_tokens=options.pop("min_tokens", 0),
                max_tokens=16,
            )
            request = types.SimpleNamespace(
                request_id=rid, prompt_token_ids=list(prompt_ids), sampling_params=params
            )
            queues[rid] = processor.add_request(request, "prompt", arrival_time=0.0, **options)
        elif name == "step":
            outs = [CoreOutput(*entry) for entry in op[1]]
            result = processor.process_outputs(outs, now=1.0)
            returned = _listed(result.reqs_to_abort)
        elif name == "abort":
            given = list(op[1])
            returned = processor.abort_requests(given)
            aborts.append((len(records), given, op[1]))
        else:
            raise ValueError(f"unknown operation {name!r}")
        # Read before an abort's answer is walked: a generator would forget nothing until then.
        tracked = _tracked(processor.request_states)
        if name == "abort":
            returned = _listed(returned)
        outputs: dict[str, list[dict[str, Any]]] = {}
        for rid, queue in queues.items():
            if items := _drain(queue):
                outputs[rid] = items
        records.append(
            {
                "op": name,
                "returned": returned,
                "outputs": outputs,
                "tracked": tracked,
                "input_changed": input_changed,
            }
        )
    # Compared after every op has run: a list of ids changed at a later op is changed all the
    # same (the caller may send it on to the core).
    for index, given, sent in aborts:
        records[index]["input_changed"] = not _holds_exactly(given, sent)
    return records


# -- cost ---------------------------------------------------------------------------------------
_CROWDED: list[tuple[Any, dict[str, Any]]] = []


def crowded_processor(num_tracked: int) -> int:
    """An ``OutputProcessor`` tracking ``num_tracked`` requests ``r0``, ``r1``, … (no prompt, no
    stop string, streamed), kept here with their queues; its number, for
    :func:`process_steps` (the judge receives plain data only)."""
    import output_processor

    processor = output_processor.OutputProcessor(ToyTokenizer())
    queues: dict[str, Any] = {}
    _CROWDED.append((processor, queues))
    for i in range(num_tracked):
        params = types.SimpleNamespace(
            logprobs=None, prompt_logprobs=None, min_tokens=0, max_tokens=16
        )
        request = types.SimpleNamespace(
            request_id=f"r{i}", prompt_token_ids=[], sampling_params=params
        )
        queues[f"r{i}"] = processor.add_request(request, None, arrival_time=0.0)
    return len(_CROWDED) - 1


def process_steps(number: int, steps: int, token: int, first_abort: int) -> list[Any]:
    """``steps`` steps of processor ``number``, in one request the judge times: each calls
    ``process_outputs`` with one new ``token`` for ``r0``..``r3``, then ``abort_requests`` of
    one more request (``r{first_abort}``, the next one at the next step). Returns how many
    outputs each of the four has queued, and what each abort returned."""
    processor, queues = _CROWDED[number]
    aborted = []
    for step in range(steps):
        processor.process_outputs([CoreOutput(f"r{i}", [token]) for i in range(4)], now=1.0)
        aborted.append(list(processor.abort_requests([f"r{first_abort + step}"])))
    return [[queues[f"r{i}"].qsize() for i in range(4)], aborted]
