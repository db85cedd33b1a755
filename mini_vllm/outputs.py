"""What ``LLM.generate`` returns: ``vllm/outputs.py``'s classes with the fields the engine fills,
so code reading vLLM's results (``outputs[0].outputs[0].text``) reads ours unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

from mini_vllm.logprobs import Logprob, SampleLogprobs


@dataclass
class CompletionOutput:
    """One generated sequence; ``stop_reason`` is the stop token id that ended it (None for EOS,
    as upstream)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The result of one request; ``num_cached_tokens``: prompt tokens served from the prefix
    cache when it was first scheduled. ``prompt_logprobs`` (when asked): None for the first
    prompt token, then per token a dict as ``CompletionOutput.logprobs``'."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int | None = None
    metrics: dict[str, float] | None = field(default=None, repr=False)
