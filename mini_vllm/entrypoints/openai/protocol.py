"""The OpenAI API's request and response bodies, as pydantic models.

Mirrors ``vllm/entrypoints/openai/completion/protocol.py``, ``chat_completion/protocol.py`` and
``engine/protocol.py`` (``ErrorResponse``, ``UsageInfo``) at the pin, reduced to the fields
mini-vLLM implements, and the bodies of ``/tokenize`` and ``/detokenize``. Requests accept
vLLM's extensions that the engine has (``top_k``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``, ``priority``,
``min_p``, ``repetition_penalty``, ``allowed_token_ids``, ``bad_words``, ``cache_salt``,
``return_token_ids``, ``return_tokens_as_token_ids``, ``truncate_prompt_tokens``,
``repetition_detection``, ``prompt_logprobs``; ``logit_bias`` is OpenAI's); a field of
upstream's that the engine cannot honour (``suffix``, structured outputs, tools:
``SamplingRequestMixin.unsupported_fields``) is
refused with a 400 unless it holds its neutral value, rather than silently ignored. Other
unknown fields are ignored, as upstream does, so that clients sending newer fields still work.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mini_vllm.logprobs import PromptLogprobs


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    # Only with --enable-prompt-tokens-details, and only when some prompt token was cached.
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    # With include_usage: every chunk carries its choice's usage so far, too.
    continuous_usage_stats: bool | None = False


class RepetitionDetection(OpenAIBaseModel):
    """vLLM's ``repetition_detection`` (``RepetitionDetectionParams``'s fields)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "mini-vllm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class SamplingRequestMixin(OpenAIBaseModel):
    """The sampling fields completions and chat share (OpenAI's plus vLLM's extensions)."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    user: str | None = None
    request_id: str | None = None  # vLLM's: the response's id (as the X-Request-Id header)
    # vLLM extensions
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Under the priority policy (``--scheduling-policy priority``) smaller runs first; under
    # FCFS ignored, as upstream's.
    priority: int = 0
    min_p: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    # Only requests with the same salt share prefix-cache blocks (a tenant's guard).
    cache_salt: str | None = None
    return_token_ids: bool | None = None  # token ids beside the text (prompt's and generated)
    bad_words: list[str] | None = None  # never generated, as a word or inside a text
    # Logprobs name their tokens "token_id:{id}" instead of their text.
    return_tokens_as_token_ids: bool | None = None
    # Stop a request whose output ends in a repeated n-gram (the engine's RepetitionDetection).
    repetition_detection: RepetitionDetection | None = None
    # Keep this many prompt tokens (-1: all that leave room for max_tokens), the last ones
    # unless truncation_side is "right" (vLLM's tokenizers truncate on the left).
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    # Per prompt token but the first, its logprob and this many best (-1: all); not streamed.
    prompt_logprobs: int | None = None
    # Upstream's fields that the server does not honour, declared so that a value other than the
    # neutral one is refused (``OpenAIServing._check_sampling``) instead of ignored.
    use_beam_search: bool = False
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    length_penalty: float = 1.0
    spaces_between_special_tokens: bool = True

    @field_validator("cache_salt")
    @classmethod
    def _check_cache_salt(cls, value: str | None) -> str | None:
        if value is not None and not value:  # upstream's check and message
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        return value

    def unsupported_fields(self) -> dict[str, Any]:
        """Each field above, truthy when it asks for something the engine would not do."""
        response_type = (self.response_format or {}).get("type", "text")
        return {
            "use_beam_search": self.use_beam_search,
            "response_format": response_type != "text",
            "structured_outputs": self.structured_outputs is not None,
            "thinking_token_budget": self.thinking_token_budget is not None,
            "length_penalty": self.length_penalty != 1.0,
            "spaces_between_special_tokens": not self.spaces_between_special_tokens,
        }

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingRequestMixin):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    prompt_embeds: Any = None
    # Whether the tokenizer adds its special tokens (a BOS) to a text prompt, as upstream.
    add_special_tokens: bool = True


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequestMixin):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # Tools would be rendered into the prompt by upstream's chat template: refused if given.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    echo: bool = False  # the last message before the reply, when the reply continues it
    continue_final_message: bool = False
    # Upstream refuses a request's own template unless --trust-request-chat-template.
    chat_template: str | None = None
    documents: list[dict[str, Any]] | None = None  # rendered by RAG templates
    return_prompt_text: bool | None = None
    # The template holds the special tokens already; true adds the tokenizer's on top, as upstream.
    add_special_tokens: bool = False


class CompletionLogProbs(OpenAIBaseModel):
    """The legacy completions format: parallel lists, one entry per generated token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # With return_token_ids (vLLM's): the choice's prompt and generated token ids.
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, when asked


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # With return_token_ids: the prompt's ids in a choice's first chunk, each chunk's new ids.
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None  # with return_token_ids: the rendered chat's
    prompt_text: str | None = None  # with return_prompt_text: the rendered chat
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, when asked


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids: this chunk's new ids


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids: in each role chunk
    prompt_text: str | None = None  # with return_prompt_text: in each role chunk


class TokenizeCompletionRequest(OpenAIBaseModel):
    """``POST /tokenize`` with a ``prompt`` (upstream: ``serve/tokenize/protocol.py``)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    """``POST /tokenize`` with ``messages``: the ids the chat route would run."""

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
