"""One request's logprobs, accumulated step by step from the engine core's rows.

Mirrors ``vllm/v1/engine/logprobs.py`` (``LogprobsProcessor``): sample logprobs and prompt
logprobs. Token texts are decoded one id at a time, as upstream's ``convert_ids_list_to_tokens``:
half of a multi-byte character shows as U+FFFD, what an OpenAI client expects from a per-token
view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mini_vllm.logprobs import (
    LogprobsLists,
    PromptLogprobs,
    SampleLogprobs,
    append_logprobs_for_next_position,
)

if TYPE_CHECKING:  # offline engines read this module without pyzmq (the server's extra)
    from mini_vllm.engine.core import EngineCoreOutput


@dataclass
class LogprobsProcessor:
    """``logprobs`` and ``cumulative_logprob`` of one request, None when it asked for none;
    ``prompt_logprobs`` likewise, starting with the first prompt token's None."""

    tokenizer: Any
    num_logprobs: int | None
    num_prompt_logprobs: int | None = None
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: PromptLogprobs | None = None
    _decoded: dict[int, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0
        if self.num_prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    def update_from_output(self, output: EngineCoreOutput) -> None:
        """Take one ``EngineCoreOutput``'s rows: its new tokens' and, on the request's first
        output, its whole prompt's (the core sends them together, as upstream's)."""
        self.update_sample_logprobs(output.new_logprobs)
        self.update_prompt_logprobs(output.new_prompt_logprobs)

    def update_sample_logprobs(self, new_logprobs: LogprobsLists | None) -> None:
        """Append one dict per row; the first column of a row is the sampled token."""
        if new_logprobs is None or self.logprobs is None or self.num_logprobs is None:
            return
        assert self.cumulative_logprob is not None
        self._append(new_logprobs, self.logprobs, self.num_logprobs)
        for row in new_logprobs.logprobs:
            self.cumulative_logprob += row[0]

    def update_prompt_logprobs(self, rows: LogprobsLists | None) -> None:
        """Append one dict per prompt token scored; a row's first column is that token."""
        if rows is None or self.prompt_logprobs is None or self.num_prompt_logprobs is None:
            return
        self._append(rows, self.prompt_logprobs, self.num_prompt_logprobs)

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt logprobs so far, forgotten here: a stream sends them once (upstream's
        ``RequestOutputKind.DELTA``)."""
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs:
            self.prompt_logprobs = []
        return prompt_logprobs

    def _append(self, rows: LogprobsLists, into: list[Any], num_logprobs: int) -> None:
        """One dict per row onto ``into``: the row's token and its ``num_logprobs`` best (-1:
        every column the row has)."""
        for token_ids, logprobs, rank in zip(
            rows.logprob_token_ids, rows.logprobs, rows.sampled_token_ranks
        ):
            wanted = len(token_ids) - 1 if num_logprobs == -1 else num_logprobs
            token_ids = token_ids[: wanted + 1]
            append_logprobs_for_next_position(
                into, token_ids, logprobs, [self._decode(t) for t in token_ids], rank, wanted
            )

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._decoded.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) or ""
            self._decoded[token_id] = text
        return text
