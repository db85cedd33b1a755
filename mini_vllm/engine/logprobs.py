"""One request's logprobs, accumulated step by step from the engine core's rows.

Mirrors ``vllm/v1/engine/logprobs.py`` (``LogprobsProcessor``), sample logprobs only. Token
texts are decoded one id at a time, as upstream's ``convert_ids_list_to_tokens``: half of a
multi-byte character shows as U+FFFD, what an OpenAI client expects from a per-token view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mini_vllm.logprobs import LogprobsLists, SampleLogprobs, append_logprobs_for_next_position


@dataclass
class LogprobsProcessor:
    """``logprobs`` and ``cumulative_logprob`` of one request, None when it asked for none."""

    tokenizer: Any
    num_logprobs: int | None
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    _decoded: dict[int, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0

    def update_from_output(self, new_logprobs: LogprobsLists | None) -> None:
        """Append one dict per row; the first column of a row is the sampled token."""
        if new_logprobs is None or self.logprobs is None or self.num_logprobs is None:
            return
        assert self.cumulative_logprob is not None
        rows = zip(new_logprobs.logprob_token_ids, new_logprobs.logprobs,
                   new_logprobs.sampled_token_ranks)  # fmt: skip
        for token_ids, logprobs, rank in rows:
            num_logprobs = len(token_ids) - 1 if self.num_logprobs == -1 else self.num_logprobs
            token_ids = token_ids[: num_logprobs + 1]
            self.cumulative_logprob += logprobs[0]
            append_logprobs_for_next_position(
                self.logprobs,
                token_ids,
                logprobs,
                [self._decode(t) for t in token_ids],
                rank,
                num_logprobs,
            )

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._decoded.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) or ""
            self._decoded[token_id] = text
        return text
