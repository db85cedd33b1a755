"""What ``LLM.generate`` returns: one ``RequestOutput`` per prompt, holding its completion.

Mirrors ``vllm/outputs.py`` (``RequestOutput``, ``CompletionOutput``) with the fields the course
engine fills; the names are upstream's so that code reading vLLM's results reads ours unchanged
(``outputs[0].outputs[0].text``). There is always exactly one completion (``n == 1``). Sample
logprobs are filled when a request asks for them (``SamplingParams.logprobs``); prompt logprobs
are not computed, so ``prompt_logprobs`` stays None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mini_vllm.logprobs import SampleLogprobs


@dataclass
class CompletionOutput:
    """One generated sequence: its tokens, their text, and why generation stopped.

    ``finish_reason`` is ``"stop"`` (EOS or a stop token) or ``"length"`` (``max_tokens`` or
    ``max_model_len`` reached); ``stop_reason`` is the stop token id when one ended it (None for
    EOS, as upstream). The stop token itself is kept in ``token_ids``.
    """

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
    """The result of one request: its prompt, its completion(s), and whether it is finished.

    ``num_cached_tokens`` is the number of prompt tokens served from the prefix cache when the
    request was first scheduled: the tokens the engine did not have to compute.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: None = None
    num_cached_tokens: int | None = None
    metrics: dict[str, float] | None = field(default=None, repr=False)
