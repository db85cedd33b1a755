"""Sampling parameters of one generation request: the subset of ``vllm/sampling_params.py``
(v0.22.1) that the engine implements, with upstream's names, defaults and validation."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from typing import Any

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5  # temperatures below this are exactly zero: greedy decoding
# Positive temperatures below this are raised to it: dividing by less overflows in low precision.
_MAX_TEMP = 1e-2


class SamplingType(IntEnum):
    """How the sampler draws a request's next token: argmax, the shared generator, or the
    request's own (so that a seed's tokens do not depend on the batch-mates)."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class RepetitionDetectionParams:
    """Stop a request (stuck in a loop) whose output ends in an n-gram repeated ``min_count``
    times; n from ``min_pattern_size`` (0 means 1) to ``max_pattern_size`` (0: off)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_pattern_size <= self.max_pattern_size:
            raise ValueError(
                "repetition detection needs 0 <= min_pattern_size <= max_pattern_size (both 0: "
                f"off), got {self.min_pattern_size} and {self.max_pattern_size}"
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(
                f"repetition detection needs min_count >= 2 (a pattern seen once is no "
                f"repetition), got {self.min_count}; set max_pattern_size=0 to turn it off"
            )


class VLLMValidationError(ValueError):
    """A refused parameter that names itself (upstream's ``vllm.exceptions.VLLMValidationError``,
    raised by its ``SamplingParams`` for the same fields): the server answers it with the field as
    the error's ``param``, without reading the message."""

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass
class SamplingParams:
    """What to generate for one prompt, and when to stop. ``n > 1`` and the text-level fields
    (``stop``, ``include_stop_str_in_output``, ``skip_special_tokens``) are read above the
    scheduler, as upstream's: the engine fans ``n`` out into ``n`` requests and checks stop
    strings on their text. The EOS token belongs to the model: the engine fills it in
    (``update_from_generation_config``), or a ``Request`` carries it."""

    n: int = 1  # output sequences per prompt (sampled; greedy allows 1)
    temperature: float = 1.0  # 0: greedy decoding (argmax)
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 keeps every token
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1) keeps every token
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one
    presence_penalty: float = 0.0  # subtracted from every token already generated once
    frequency_penalty: float = 0.0  # subtracted once per time a token was generated
    repetition_penalty: float = 1.0  # divides (> 0) or multiplies (<= 0) prompt/output tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: list[int] | None = None  # only these may be generated
    bad_words: list[str] | None = None  # words never generated (their last token is masked)
    seed: int | None = None  # per-request seed; None draws from the engine's generator
    stop: str | list[str] | None = None  # end generation when the text shows one; cut before it
    stop_token_ids: list[int] | None = None  # end generation; id in token_ids, not its text
    include_stop_str_in_output: bool = False  # keep the stop string in the text
    skip_special_tokens: bool = True  # leave special tokens out of the text
    ignore_eos: bool = False  # generate past EOS (benchmarks do)
    max_tokens: int | None = 16  # None: up to the model's length limit
    min_tokens: int = 0  # before EOS or a stop token may end the request
    repetition_detection: RepetitionDetectionParams | None = None
    logprobs: int | None = None  # per output token, its own and the top ones' (-1: all)
    prompt_logprobs: int | None = None  # the same per prompt token but the first (-1: all)

    _eos_token_id: int | None = field(default=None, repr=False)
    # bad_words as token id sequences, filled by update_from_tokenizer (upstream's name).
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            logger.warning(
                "temperature %s would overflow the logits; using %s", self.temperature, _MAX_TEMP
            )
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        if self.logit_bias is not None:
            # Ids may arrive as JSON's string keys; biases are clamped as OpenAI's API says.
            try:
                self.logit_bias = {
                    int(token): min(100.0, max(-100.0, float(bias)))
                    for token, bias in self.logit_bias.items()
                }
            except (TypeError, ValueError):
                raise VLLMValidationError(
                    f"logit_bias must map token ids to numbers, got {self.logit_bias}",
                    parameter="logit_bias",
                ) from None
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        self.bad_words = [] if self.bad_words is None else list(self.bad_words)
        if self.logprobs is True:
            self.logprobs = 1  # upstream's shorthand (OpenAI's ``logprobs: true``): the top one
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            if self.n > 1:  # upstream's _verify_greedy_sampling: n greedy samples are one
                raise VLLMValidationError(
                    f"n must be 1 when using greedy sampling, got {self.n}", parameter="n"
                )
            # Greedy ignores the truncation knobs: normalised, greedy requests compare equal.
            # (The penalties stay: they change which token is the argmax.)
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
        self._all_stop_token_ids.update(self.stop_token_ids)

    def _verify_args(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            raise ValueError(f"n must be an int, got {type(self.n).__name__}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0.0:
            raise VLLMValidationError(
                f"temperature must be non-negative, got {self.temperature}", parameter="temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(
                f"top_p must be in (0, 1], got {self.top_p}", parameter="top_p"
            )
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise TypeError(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disabled), -1 (disabled) or >= 1, got {self.top_k}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
            if value is not None and value < -1:
                raise VLLMValidationError(
                    f"{name} must be non-negative or -1, got {value}", parameter=name
                )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(
                f"max_tokens must be at least 1, got {self.max_tokens}", parameter="max_tokens"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:  # OpenAI's range, as upstream's check
                raise VLLMValidationError(
                    f"{name} must be in [-2, 2], got {getattr(self, name)}", parameter=name
                )
        if not self.repetition_penalty > 0.0:
            raise VLLMValidationError(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}",
                parameter="repetition_penalty",
            )
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise VLLMValidationError(
                    "allowed_token_ids is not None and empty!", parameter="allowed_token_ids"
                )
            if not all(type(t) is int for t in self.allowed_token_ids):
                raise VLLMValidationError(
                    f"allowed_token_ids must hold only ints, got {self.allowed_token_ids}",
                    parameter="allowed_token_ids",
                )
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(
                f"min_p must be in [0, 1], got {self.min_p}", parameter="min_p"
            )
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        assert isinstance(self.stop_token_ids, list)
        if not all(
            isinstance(tok, int) and not isinstance(tok, bool) for tok in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must contain only ints, got {self.stop_token_ids}")
        assert isinstance(self.stop, list)
        if not all(isinstance(stop_str, str) and stop_str for stop_str in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop}")
        assert isinstance(self.bad_words, list)
        if not all(isinstance(word, str) and word for word in self.bad_words):
            raise VLLMValidationError(
                f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}",
                parameter="bad_words",
            )

    def verify_token_ids(self, vocab_size: int) -> None:
        """Refuse ids outside the vocabulary in ``logit_bias`` and ``allowed_token_ids``, as
        upstream's ``_validate_logit_bias`` and ``_validate_allowed_token_ids`` (the engine
        knows the vocabulary; the constructor does not)."""
        for name, ids in (
            ("logit_bias", self.logit_bias),
            ("allowed_token_ids", self.allowed_token_ids),
        ):
            bad = [t for t in ids or () if not 0 <= t < vocab_size]
            if bad:
                raise VLLMValidationError(
                    f"token id(s) {bad[:5]} in {name} are outside the vocabulary "
                    f"(size {vocab_size})",
                    parameter=name,
                )

    def update_from_tokenizer(self, tokenizer: Any, vocab_size: int) -> None:
        """Tokenize ``bad_words`` (upstream's method): each word as it is and after a space,
        the spelling it takes inside a text, when that is a different token sequence of the
        same length. The sampler bans a sequence's last token after its others."""
        if not self.bad_words:
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            inside = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if alone:
                sequences.append(alone)
            if inside and (not alone or (inside[0] != alone[0] and len(inside) == len(alone))):
                sequences.append(inside)
        bad = [t for ids in sequences for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise VLLMValidationError(
                f"The model vocabulary size is {vocab_size}, but the following tokens were "
                f"specified as bad: {bad}.",
                parameter="bad_words",
            )
        self._bad_words_token_ids = sequences

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        return self._bad_words_token_ids

    def verify_logprobs(self, max_logprobs: int, vocab_size: int) -> None:
        """Refuse more logprobs (or prompt logprobs) than the engine's ``max_logprobs`` (-1, on
        either side, counts as the whole vocabulary); upstream's ``_validate_logprobs``."""
        allowed = vocab_size if max_logprobs == -1 else max_logprobs
        for kind, name, asked in (
            ("sample", "logprobs", self.logprobs),
            ("prompt", "prompt_logprobs", self.prompt_logprobs),
        ):
            wanted = vocab_size if asked == -1 else asked
            if wanted is not None and wanted > allowed:
                raise VLLMValidationError(
                    f"requested {kind} logprobs of {wanted}, which is greater than max allowed: "
                    f"{allowed} (raise max_logprobs)",
                    parameter=name,
                )

    def update_from_generation_config(
        self, generation_config: dict[str, Any], eos_token_id: int | None = None
    ) -> None:
        """Record the model's EOS token(s); the config's extra EOS ids become stop tokens.
        Called by the engine on its per-request ``clone``: a user's object may be shared."""
        if not self.ignore_eos:
            self._eos_token_id = eos_token_id
        if eos_token_id is not None:
            self._all_stop_token_ids.add(eos_token_id)
        eos_ids = generation_config.get("eos_token_id")
        if eos_ids is None:
            return
        extra = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
        extra.discard(eos_token_id)
        if extra:
            self._all_stop_token_ids.update(extra)
            if not self.ignore_eos:
                assert self.stop_token_ids is not None
                self.stop_token_ids = sorted(extra | set(self.stop_token_ids))

    def clone(self) -> SamplingParams:
        """A deep-enough copy that the engine may update per request."""
        # Built afresh (validated, normalised); the stop-id set is then the original's, copied.
        new = replace(
            self,
            logit_bias=None if self.logit_bias is None else dict(self.logit_bias),
            bad_words=list(self.bad_words or []),
            stop=list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            _all_stop_token_ids=set(),
        )
        new._all_stop_token_ids = set(self._all_stop_token_ids)
        return new

    @cached_property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def has_penalties(self) -> bool:
        """Whether a penalty changes the logits (upstream's ``no_penalties``, per request)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def eos_token_id(self) -> int | None:
        """The EOS token set by the engine, None under ``ignore_eos``."""
        return self._eos_token_id

    @property
    def all_stop_token_ids(self) -> set[int]:
        """Every id that may end generation (EOS included), for min_tokens masking."""
        return self._all_stop_token_ids
