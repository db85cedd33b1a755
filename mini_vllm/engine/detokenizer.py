"""Incremental detokenization: token ids arrive one step at a time, text leaves as deltas.

Mirrors ``SlowIncrementalDetokenizer`` and ``check_stop_strings`` of
``vllm/v1/engine/detokenizer.py``. A token is bytes, not characters, so each step re-decodes a
short window and emits only what the new tokens added. Why, and the window's offsets:
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# How many prompt tokens seed the window: enough context for SentencePiece's leading-space
# rule and for a character split across the prompt/output boundary (upstream uses 5 too).
INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, correct across split characters.

    The prompt's last few tokens seed the window (the first output token decodes in context) and
    are never part of the output; ``tokenizer.decode`` is the only tokenizer call. The output is
    cut before the first stop string found (after it, with ``include_stop_str_in_output``); as
    upstream, none is looked for before ``min_tokens`` output tokens, nor in their text (what
    the finish flushes of it included).
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        # Hold back characters that may be the start of a stop string (streaming only).
        self.stop_buffer_length = (
            max((len(s) for s in self.stop), default=1) - 1 if not include_stop_str_in_output else 0
        )
        context = list(prompt_token_ids[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:])
        self.tokens: list[int] = context
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self._num_sent_chars = 0  # of output_text already handed out as deltas (delta=True)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=self.skip_special_tokens)

    def _decode_next(self, flush: bool = False) -> str:
        """The text the tokens after ``read_offset`` add to the window, or "" if incomplete."""
        prefix_text = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.tokens[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and (flush or not new_text.endswith(REPLACEMENT_CHAR)):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            return delta
        return ""

    def update(
        self, new_token_ids: Sequence[int], finished: bool = False, stop_terminated: bool = False
    ) -> str | None:
        """Add one step's tokens; return the stop string that ended the text, if any (then
        ``output_text`` is cut at it, and the caller must finish the request).

        ``stop_terminated``: the engine stopped on the last token (EOS or a stop token id); as
        upstream, that token's text is left out unless ``include_stop_str_in_output``.
        """
        # Where the stop-string search may start: the text of the first min_tokens is exempt.
        stop_check_offset = len(self.output_text)
        new_token_ids = [int(t) for t in new_token_ids]
        skipped: int | None = None
        if stop_terminated and new_token_ids and not self.include_stop_str_in_output:
            skipped = new_token_ids.pop()
        for token_id in new_token_ids:
            self.tokens.append(token_id)
            self.output_token_ids.append(token_id)
            self.output_text += self._decode_next()
            if len(self.output_token_ids) <= self.min_tokens:
                stop_check_offset = len(self.output_text)
        if skipped is not None:
            self.output_token_ids.append(skipped)  # counted as output, never decoded
        if finished:
            self.output_text += self.flush()
            if len(self.output_token_ids) - (skipped is not None) <= self.min_tokens:
                # The flush adds the last decoded token's held-back text: exempt with it.
                stop_check_offset = len(self.output_text)
        if not self.stop or len(self.output_token_ids) <= self.min_tokens:
            return None
        new_char_count = len(self.output_text) - stop_check_offset
        match = check_stop_strings(
            self.output_text, new_char_count, self.stop, self.include_stop_str_in_output
        )
        if match is None:
            return None
        stop_str, truncate_to = match
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

    def flush(self) -> str:
        """Emit whatever is still held back (an incomplete character decodes as U+FFFD)."""
        if self.read_offset >= len(self.tokens):
            return ""
        return self._decode_next(flush=True)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to send now: new characters since the last call (``delta``) or all of it.

        While unfinished, the last ``stop_buffer_length`` characters are withheld: they may start
        a stop string, and text once streamed cannot be taken back.
        """
        length = (
            len(self.output_text)
            if finished
            else max(len(self.output_text) - self.stop_buffer_length, 0)
        )
        if not delta:
            return self.output_text[:length]
        if length <= self._num_sent_chars:
            return ""
        text = self.output_text[self._num_sent_chars : length]
        self._num_sent_chars = length
        return text


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string that the last ``new_char_count`` characters completed.

    Only a match ending in the new characters is new (an earlier one stopped the request a step
    ago), so the search starts ``len(stop_str) - 1`` characters before the new text; of several,
    the one that starts first wins. Returns ``(stop_str, truncate_to)``: cut the output to
    ``truncate_to`` characters (-1: nothing to cut); None when no stop string was found.
    """
    if not new_char_count:
        return None
    best: tuple[int, str] | None = None
    for stop_str in stop:
        start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
        index = output_text.find(stop_str, start)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop_str)
    if best is None:
        return None
    index, stop_str = best
    if include_in_output:
        end = index + len(stop_str)
        return stop_str, (end if end < len(output_text) else -1)
    return stop_str, index
