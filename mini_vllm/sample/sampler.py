"""Turn one row of logits per request into one token per request: greedy, temperature, top-k/p.

Mirrors ``vllm/v1/sample/sampler.py`` (``Sampler``), ``vllm/v1/sample/metadata.py``
(``SamplingMetadata``) and ``vllm/v1/sample/ops/topk_topp_sampler.py`` (``apply_top_k_top_p``,
``random_sample``), with upstream's penalties (``apply_penalties`` of
``vllm/model_executor/layers/utils.py``) and ``min_p``, without its other logits processors. The
whole batch is sampled with tensor ops, greedy and random rows mixed; only the draws are per
request, so that a seeded request's tokens depend on its seed alone, and logprobs come from the
raw logits (details: docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mini_vllm.logprobs import LogprobsTensors

# Temperatures below this mean greedy decoding (the same threshold as SamplingParams).
_SAMPLING_EPS = 1e-5


@dataclass
class SamplingMetadata:
    """Per-row sampling settings of one batch, as tensors (row ``i`` = request ``i``).

    ``top_k``/``top_p`` are None when no row uses them, so the common all-default batch skips the
    sort entirely. ``generators`` maps a row to its request's own generator (seeded requests);
    other random rows draw from ``default_generator``.
    """

    temperature: torch.Tensor | None  # [num_reqs] float32, 0 for greedy rows; None if all_greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [num_reqs] float32 in (0, 1]
    top_k: torch.Tensor | None  # [num_reqs] int64; vocab size where disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    default_generator: torch.Generator | None = None
    # Rows that may not stop yet (min_tokens): row -> token ids to forbid.
    stop_token_masks: dict[int, list[int]] = field(default_factory=dict)
    # The most logprobs any row asked for (0: the sampled token's only); None: no row asked.
    max_num_logprobs: int | None = None
    penalties: PenaltyState | None = None  # None: no row has one
    # logit_bias as (rows, token ids, biases), one entry per biased token; None: no row has one.
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # [num_reqs, vocab] bool, True where a row's allowed_token_ids leave a token out; None: none.
    disallowed_mask: torch.Tensor | None = None
    # bad_words as (rows, token ids, -inf or 0) added to the logits; None: no row has one.
    bad_words: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    min_p: torch.Tensor | None = None  # [num_reqs] float32; None: no row uses it


@dataclass
class PenaltyState:
    """What the penalties of one batch read: per row, which tokens its prompt holds, how often
    each token was generated, and its three penalties (neutral in rows that set none)."""

    prompt_mask: torch.Tensor  # [num_reqs, vocab] bool
    output_counts: torch.Tensor  # [num_reqs, vocab] float32
    presence: torch.Tensor  # [num_reqs] float32
    frequency: torch.Tensor  # [num_reqs] float32
    repetition: torch.Tensor  # [num_reqs] float32


@dataclass
class SamplerOutput:
    """One token per row (on the device) and, if any row asked, their logprobs."""

    sampled_token_ids: torch.Tensor  # [num_reqs] int64
    logprobs_tensors: LogprobsTensors | None = None


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Set to ``-inf`` every logit outside a row's top ``k`` and outside its top-``p`` nucleus.

    Sorting once (ascending) serves both masks: top-k keeps the last ``k`` sorted entries; top-p
    drops the leading entries whose cumulative probability stays within ``1 - p``, which leaves
    the smallest set of most likely tokens whose mass reaches ``p``. The most likely token always
    survives, so a row never becomes all ``-inf``. Ties at the k-th value are all kept.
    """
    if k is None and p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if k is not None:
        kth_index = (vocab - k.clamp(1, vocab)).unsqueeze(1)
        kth_value = sorted_logits.gather(1, kth_index)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))
    if p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= (1 - p).unsqueeze(1)
        outside[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[num_reqs, vocab_size]`` counts of each row's ``token_ids``, padded with ``vocab_size``
    (a column that is dropped), as float32 for the penalties' arithmetic."""
    counts = torch.zeros(
        token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device
    )
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, state: PenaltyState) -> torch.Tensor:
    """Upstream's penalties, out of place. The repetition penalty divides a positive logit and
    multiplies any other of every token seen in the prompt or the output (Hugging Face's
    ``repetition_penalty``); then, by OpenAI's definition, each generated token's logit loses
    ``frequency`` per time it was generated and ``presence`` once."""
    seen = state.prompt_mask | (state.output_counts > 0)
    repetition = torch.where(seen, state.repetition.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = logits - state.frequency.unsqueeze(1) * state.output_counts
    return logits - state.presence.unsqueeze(1) * (state.output_counts > 0)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Set to ``-inf`` every token less likely than ``min_p`` times the row's most likely one
    (after the temperature, as upstream's ``MinPLogitsProcessor``); ``min_p = 0`` keeps all."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def random_sample(
    probs: torch.Tensor,
    generators: dict[int, torch.Generator],
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row from ``probs``: ``argmax(probs / q)`` with ``q ~ Exp(1)``.

    This "exponential race" samples exactly from the categorical distribution (the first of
    independent exponential clocks with rates ``probs`` to ring), and unlike
    ``torch.multinomial`` it needs no host synchronisation and lets each row use its own
    generator: seeded rows draw their noise from their own stream, one ``vocab_size`` draw per
    step, so their tokens do not depend on the rest of the batch.
    """
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_(generator=default_generator)
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div(q).argmax(dim=-1)


class Sampler(nn.Module):
    """One token per row of ``logits`` ``[num_reqs, vocab_size]``, following ``SamplingMetadata``.

    Order of operations as upstream: float32 logits, ``allowed_token_ids``, ``bad_words``, the
    ``min_tokens`` stop masks, ``logit_bias``, penalties, greedy argmax, temperature,
    ``min_p``, top-k/top-p, softmax, random draw, then per-row choice between the greedy and
    the random token; the logprobs, if asked, come from the untouched logits.
    """

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        sampled = self.sample(logits, metadata)  # leaves ``logits`` untouched
        if metadata.max_num_logprobs is None:
            return SamplerOutput(sampled)
        raw_logprobs = self.compute_logprobs(logits)
        return SamplerOutput(
            sampled, self.gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        )

    @staticmethod
    def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    @staticmethod
    def gather_logprobs(
        logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
    ) -> LogprobsTensors:
        """Each row's sampled token then its ``num_logprobs`` best, and the sampled token's rank.

        The rank counts the tokens at least as likely as the sampled one, so the argmax has
        rank 1 and a tie ranks every tied token last among them, as upstream counts it.
        """
        top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
        token_ids = token_ids.unsqueeze(-1)
        token_logprobs = logprobs.gather(-1, token_ids)
        ranks = (logprobs >= token_logprobs).sum(-1)
        return LogprobsTensors(
            torch.cat((token_ids, top_ids), dim=1),
            torch.cat((token_logprobs, top_logprobs), dim=1),
            ranks,
        )

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """One token id per row, on the device."""
        processed = bool(metadata.stop_token_masks) or any(
            rule is not None
            for rule in (
                metadata.penalties,
                metadata.logit_bias,
                metadata.disallowed_mask,
                metadata.bad_words,
            )
        )
        if metadata.all_greedy and not processed:
            # Widening to float32 is exact and order-preserving, so the argmax of the model's
            # own dtype is the same token, without a [num_reqs, vocab] conversion pass.
            return logits.argmax(dim=-1)
        logits = logits.to(torch.float32)
        if metadata.disallowed_mask is not None:
            logits = logits.masked_fill(metadata.disallowed_mask, float("-inf"))
        bias, bad_words = metadata.logit_bias, metadata.bad_words
        if metadata.stop_token_masks or bias is not None or bad_words is not None:
            logits = logits.clone()
            if bad_words is not None:
                # Accumulated: a token banned by one word and spared by another stays banned.
                bad_rows, bad_tokens, bans = bad_words
                logits.index_put_((bad_rows, bad_tokens), bans, accumulate=True)
            for row, token_ids in metadata.stop_token_masks.items():
                logits[row, token_ids] = float("-inf")
            if bias is not None:
                bias_rows, bias_tokens, biases = bias
                logits[bias_rows, bias_tokens] += biases
        if metadata.penalties is not None:
            logits = apply_penalties(logits, metadata.penalties)
        greedy = logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy
        temperature = metadata.temperature
        if temperature is None:
            raise ValueError("temperature may only be None when every row is greedy")
        divisor = temperature
        if not metadata.all_random:
            divisor = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature)
        logits = logits / divisor.unsqueeze(1)
        if metadata.min_p is not None:
            logits = apply_min_p(logits, metadata.min_p)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        sampled = random_sample(
            logits.softmax(dim=-1), metadata.generators, metadata.default_generator
        )
        if metadata.all_random:
            return sampled
        return torch.where(temperature < _SAMPLING_EPS, greedy, sampled)
