"""One step's ``SamplingMetadata``, gathered from the input batch's rows.

Upstream builds it in ``InputBatch._make_sampling_metadata``
(``vllm/v1/worker/gpu_input_batch.py``); here it is a module of its own so that the runner's
step reads in one sitting. Only what the batch uses is built: an all-greedy batch with no masks,
biases or penalties needs no per-row tensor, and every tensor that is built goes up through the
runner's pinned ``upload``, which does not wait for the step in flight (a pageable copy would).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from mini_vllm.sample.sampler import PenaltyState, SamplingMetadata, token_counts
from mini_vllm.worker.input_batch import InputBatch

Upload = Callable[[torch.Tensor], torch.Tensor]
#: The output tokens the step in flight is sampling, as (sample index, column, id) on the device.
LateTokens = Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]


def make_sampling_metadata(
    batch: InputBatch,
    rows: np.ndarray,
    num_output_tokens: np.ndarray,
    vocab_size: int,
    upload: Upload,
    default_generator: torch.Generator | None,
    late_tokens: LateTokens,
) -> SamplingMetadata:
    """The sampled rows' settings. ``num_output_tokens[i]`` counts row ``i``'s output so far, a
    token still in flight included: ``min_tokens`` masks stops below it, and the penalties count
    that token, whose id ``late_tokens`` gives on the device."""
    late_tokens = functools.cache(late_tokens)  # the penalties and the bad words both read it
    penalties = None
    if batch.penalty_rows and not batch.penalty_rows.isdisjoint(rows.tolist()):
        penalties = _penalty_state(batch, rows, num_output_tokens, vocab_size, upload, late_tokens)
    logit_bias, disallowed_mask = _token_rules(batch, rows, vocab_size, upload)
    bad_words = None
    if batch.bad_words_token_ids:
        bad_words = _bad_words(batch, rows, num_output_tokens, upload, late_tokens)
    stop_token_masks: dict[int, list[int]] = {}
    max_num_logprobs = None
    if batch.min_tokens_rows or batch.num_logprobs:
        asked = []
        for i, row in enumerate(rows.tolist()):
            k = batch.num_logprobs.get(row)
            if k is not None:
                asked.append(vocab_size if k == -1 else k)
            if row in batch.min_tokens_rows:
                params = batch.sampling_params[row]
                assert params is not None
                if num_output_tokens[i] < params.min_tokens:
                    stop_token_masks[i] = sorted(params.all_stop_token_ids)
        max_num_logprobs = max(asked) if asked else None
    greedy = batch.is_greedy[rows]
    if greedy.all():
        # The common offline case: an argmax needs none of the per-row tensors, whose
        # host-to-device copies would cost more than the argmax itself.
        return SamplingMetadata(
            temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
            stop_token_masks=stop_token_masks, max_num_logprobs=max_num_logprobs,
            penalties=penalties, logit_bias=logit_bias, disallowed_mask=disallowed_mask,
            bad_words=bad_words,
        )  # fmt: skip
    top_k = batch.top_k[rows]
    top_k = np.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size)
    top_p, min_p = batch.top_p[rows], batch.min_p[rows]
    generators = {}
    if batch.generators:
        generators = {
            i: batch.generators[row]
            for i, row in enumerate(rows.tolist())
            if row in batch.generators
        }
    return SamplingMetadata(
        temperature=upload(torch.from_numpy(batch.temperature[rows])),
        all_greedy=False,
        all_random=not greedy.any(),
        top_p=None if (top_p >= 1.0).all() else upload(torch.from_numpy(top_p)),
        top_k=None if (top_k == vocab_size).all() else upload(torch.from_numpy(top_k)),
        generators=generators,
        default_generator=default_generator,
        stop_token_masks=stop_token_masks,
        max_num_logprobs=max_num_logprobs,
        penalties=penalties,
        logit_bias=logit_bias,
        disallowed_mask=disallowed_mask,
        bad_words=bad_words,
        min_p=upload(torch.from_numpy(min_p)) if min_p.any() else None,
    )


def _token_rules(
    batch: InputBatch, rows: np.ndarray, vocab_size: int, upload: Upload
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
    """The rows' ``logit_bias`` entries, as (row, token, bias) index tensors, and the tokens
    their ``allowed_token_ids`` leave out, as a mask; None where no row has one (the common
    case costs two dict checks)."""
    logit_bias = disallowed = None
    if batch.logit_bias:
        entries = [
            (i, token, bias)
            for i, row in enumerate(rows.tolist())
            for token, bias in batch.logit_bias.get(row, {}).items()
        ]
        if entries:
            indices, tokens, biases = zip(*entries)
            logit_bias = (
                upload(torch.tensor(indices)),
                upload(torch.tensor(tokens)),
                upload(torch.tensor(biases, dtype=torch.float32)),
            )
    if batch.allowed_token_ids:
        limited = [
            (i, batch.allowed_token_ids[row])
            for i, row in enumerate(rows.tolist())
            if row in batch.allowed_token_ids
        ]
        if limited:
            mask = np.zeros((len(rows), vocab_size), dtype=bool)
            for i, ids in limited:
                mask[i] = True
                mask[i, ids] = False
            disallowed = upload(torch.from_numpy(mask))
    return logit_bias, disallowed


def _bad_words(
    batch: InputBatch,
    rows: np.ndarray,
    num_output_tokens: np.ndarray,
    upload: Upload,
    late_tokens: LateTokens,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Upstream's ``apply_bad_words``, as ``(rows, token ids, -inf or 0)`` to add to the logits:
    a bad word's last token is banned where the output ends with the word's other tokens (a
    one-token word always). Only the output counts, not the prompt, as upstream's.

    Under async scheduling a row's last output token may still be in flight, its id known only
    on the device: the host checks the word's earlier tokens, and the ban on the last one is
    decided on the device by comparing the in-flight id with the token the word expects there,
    so the host never waits for the GPU (upstream waits for the previous step's copy)."""
    banned: list[tuple[int, int]] = []
    pending: list[tuple[int, int, int]] = []  # (index, token to ban, in-flight id it needs)
    for i, row in enumerate(rows.tolist()):
        words = batch.bad_words_token_ids.get(row)
        if not words:
            continue
        num_output, num_prompt = int(num_output_tokens[i]), int(batch.num_prompt_tokens[row])
        num_known = min(num_output, int(batch.num_tokens[row]) - num_prompt)
        known = batch.token_ids_cpu[row, num_prompt : num_prompt + num_known].tolist()
        in_flight = num_output > num_known
        for word in words:
            prefix = word[:-1]
            if len(prefix) > num_output:
                continue
            if not prefix:
                banned.append((i, word[-1]))
            elif not in_flight:
                if known[num_known - len(prefix) :] == prefix:
                    banned.append((i, word[-1]))
            elif known[num_known - len(prefix) + 1 :] == prefix[:-1]:
                pending.append((i, word[-1], prefix[-1]))
    if not banned and not pending:
        return None
    ban_rows = [i for i, _ in banned] + [i for i, _, _ in pending]
    ban_tokens = [t for _, t in banned] + [t for _, t, _ in pending]
    values = upload(torch.full((len(banned),), float("-inf")))
    if pending:
        late = late_tokens()
        assert late is not None, "a row's output ends in flight, but no token is in flight"
        indices, _, token_ids = late
        in_flight_ids = token_ids.new_full((len(rows),), -1)
        in_flight_ids[indices] = token_ids
        rows_t = upload(torch.tensor([i for i, _, _ in pending]))
        expected = upload(torch.tensor([t for _, _, t in pending], dtype=token_ids.dtype))
        hit = in_flight_ids[rows_t] == expected
        values = torch.cat((values, torch.where(hit, float("-inf"), 0.0)))
    return upload(torch.tensor(ban_rows)), upload(torch.tensor(ban_tokens)), values


def _penalty_state(
    batch: InputBatch,
    rows: np.ndarray,
    num_output_tokens: np.ndarray,
    vocab_size: int,
    upload: Upload,
    late_tokens: LateTokens,
) -> PenaltyState:
    """The rows' prompt masks and output counts, and their penalties. A token the step in
    flight samples is the last output token of its request here: its id, known only on the
    device, is written over the placeholder there before counting."""
    output_ids = upload(
        torch.from_numpy(batch.padded_output_ids(rows, num_output_tokens, vocab_size))
    )
    late = late_tokens()
    if late is not None:
        positions, columns, token_ids = late
        output_ids[positions, columns] = token_ids

    def per_row(values: np.ndarray) -> torch.Tensor:
        return upload(torch.from_numpy(values[rows]))

    return PenaltyState(
        prompt_mask=batch.prompt_mask(rows, vocab_size, upload),
        output_counts=token_counts(output_ids, vocab_size),
        presence=per_row(batch.presence_penalty),
        frequency=per_row(batch.frequency_penalty),
        repetition=per_row(batch.repetition_penalty),
    )
