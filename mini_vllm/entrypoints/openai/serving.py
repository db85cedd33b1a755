"""The logic behind ``/v1/completions`` and ``/v1/chat/completions`` (and ``/tokenize``,
``/detokenize``).

Mirrors ``vllm/entrypoints/openai/completion/serving.py`` and ``chat_completion/serving.py`` (and
the checks of ``engine/serving.py``), in one module because here the two differ only in how the
prompt is built and how a choice is formatted. Every request goes through the same four stages
(check, build the prompt, add one engine request per sample, stream or collect), and only the
last starts the HTTP response, so a failure before it is a proper status code, never a broken
stream (the stages: docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
from pydantic import BaseModel

from mini_vllm.engine.async_llm import AsyncLLM
from mini_vllm.engine.core import EngineCoreSamplingParams
from mini_vllm.entrypoints.chat_utils import text_content
from mini_vllm.entrypoints.openai.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    DeltaMessage,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    PromptTokenUsageInfo,
    SamplingRequestMixin,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
    random_uuid,
)
from mini_vllm.logprobs import Logprob, PromptLogprobs, SampleLogprobs
from mini_vllm.metrics.stats import ParentRequestStats
from mini_vllm.outputs import RequestOutput
from mini_vllm.sampling_params import RepetitionDetectionParams, SamplingParams

# Largest seed a torch.Generator takes.
_MAX_SEED = 2**63 - 1


class BadRequestError(Exception):
    """The request is wrong; answered with 400 and this message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def refuse_unsupported(unsupported: dict[str, Any]) -> None:
    """400 for the first field that asks for something the engine would not do (truthy)."""
    for field, value in unsupported.items():
        if value:
            raise BadRequestError(
                f"`{field}` is not supported by mini-vLLM: leave it unset (or at its neutral "
                "value); the engine would not honour it",
                param=field,
            )


def error_response(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return ErrorResponse(
        error=ErrorInfo(message=message, type=err_type, param=param, code=code)
    ).model_dump()


class _Prompt:
    __slots__ = ("text", "token_ids")

    def __init__(self, text: str | None, token_ids: list[int]) -> None:
        self.text = text
        self.token_ids = token_ids


class OpenAIServing:
    """Completions and chat completions over one ``AsyncLLM``."""

    def __init__(
        self,
        engine: AsyncLLM,
        served_model_name: str,
        enable_prompt_tokens_details: bool = False,
        *,
        chat_template: str | None = None,
        default_chat_template_kwargs: dict[str, Any] | None = None,
        trust_request_chat_template: bool = False,
    ) -> None:
        self.engine = engine
        self.served_model_name = served_model_name
        self.tokenizer = engine.tokenizer
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.chat_template = chat_template  # --chat-template; None: the tokenizer's
        self.default_chat_template_kwargs = default_chat_template_kwargs or {}
        self.trust_request_chat_template = trust_request_chat_template

    # ------------------------------------------------------------- checks

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise BadRequestError(
                f"The model `{model}` does not exist; this server serves "
                f"`{self.served_model_name}`.",
                param="model",
            )

    def _check_sampling(
        self,
        request: SamplingRequestMixin,
        unsupported: dict[str, Any],
        num_logprobs: int | None = None,
        num_prompt_logprobs: int | None = None,
    ) -> EngineCoreSamplingParams:
        refuse_unsupported({**unsupported, **request.unsupported_fields()})
        check_prompt_logprobs(request)
        options = request.stream_options
        if options is not None and options.model_fields_set and not request.stream:
            # Upstream's validate_stream_options.
            raise BadRequestError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if not isinstance(request.n, int) or request.n < 1:
            raise BadRequestError(f"n must be at least 1, got {request.n}", param="n")
        max_n = int(self.engine.engine_args.max_num_seqs)
        if request.n > max_n:
            raise BadRequestError(f"n must be at most max_num_seqs={max_n}", param="n")
        if request.seed is not None and not 0 <= request.seed <= _MAX_SEED - request.n:
            raise BadRequestError(f"seed must be in [0, 2**63 - n), got {request.seed}", "seed")
        if any(not s for s in request.stop_list()):
            raise BadRequestError("stop strings must not be empty", param="stop")
        # The keyword arguments of both constructors below (each checks them at run time).
        values: dict[str, Any] = dict(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=0 if request.top_k is None else request.top_k,
            min_p=request.min_p or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=1.0
            if request.repetition_penalty is None
            else request.repetition_penalty,
            logit_bias=request.logit_bias,  # JSON's string keys: SamplingParams makes them ids
            allowed_token_ids=request.allowed_token_ids,
            seed=request.seed,
            min_tokens=request.min_tokens,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            logprobs=num_logprobs,
            prompt_logprobs=num_prompt_logprobs,
        )
        if request.repetition_detection is not None:
            try:
                values["repetition_detection"] = RepetitionDetectionParams(
                    **request.repetition_detection.model_dump()
                )
            except ValueError as exc:
                raise BadRequestError(str(exc), param="repetition_detection") from None
        try:
            # The engine's own validation (greedy n > 1 included): the server accepts exactly
            # what LLM.generate does.
            checked = SamplingParams(
                **values, n=request.n, max_tokens=None, bad_words=request.bad_words
            )
        except (ValueError, TypeError) as exc:
            raise BadRequestError(str(exc), param=getattr(exc, "parameter", None)) from None
        self._check_against_the_vocabulary(checked)
        values["logit_bias"] = checked.logit_bias  # int ids, biases clamped to [-100, 100]
        values["bad_words_token_ids"] = checked.bad_words_token_ids
        return EngineCoreSamplingParams(**values)

    def _check_against_the_vocabulary(self, params: SamplingParams) -> None:
        """At most the engine's ``max_logprobs`` (upstream's default 20; -1: the vocabulary),
        and no token id outside the vocabulary in ``logit_bias``, ``allowed_token_ids`` or the
        tokenized ``bad_words`` (tokenized here: the engine core has no tokenizer)."""
        vocab_size = self.vocab_size
        try:
            params.verify_logprobs(int(self.engine.engine_args.max_logprobs), vocab_size)
            params.verify_token_ids(vocab_size)
            params.update_from_tokenizer(self.tokenizer, vocab_size)
        except ValueError as exc:
            raise BadRequestError(str(exc), param=getattr(exc, "parameter", None)) from None

    def _check_length(self, prompt_len: int, max_tokens: int | None, field: str) -> int:
        """Resolve ``max_tokens`` against ``max_model_len``; 400 when it cannot fit."""
        max_model_len = self.engine.max_model_len
        if prompt_len == 0:
            raise BadRequestError("the prompt is empty (zero tokens)", param="prompt")
        if prompt_len >= max_model_len:
            raise BadRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"request has {prompt_len} input tokens, which leaves no room for output. "
                "Please reduce the length of the input.",
                param="messages" if field == "max_completion_tokens" else "prompt",
            )
        if max_tokens is None:
            return max_model_len - prompt_len
        if max_tokens < 1:
            raise BadRequestError(f"{field} must be at least 1, got {max_tokens}", param=field)
        if prompt_len + max_tokens > max_model_len:
            raise BadRequestError(
                f"'{field}' is too large: {max_tokens}. This model's maximum context length is "
                f"{max_model_len} tokens and your request has {prompt_len} input tokens "
                f"({prompt_len} + {max_tokens} > {max_model_len}).",
                param=field,
            )
        return max_tokens

    def _truncate(
        self, prompt: _Prompt, request: SamplingRequestMixin, max_tokens: int | None
    ) -> _Prompt:
        """Upstream's ``truncate_prompt_tokens``: keep the prompt's last ``k`` tokens (its
        first with ``truncation_side="right"``); ``-1`` keeps as many as leave room for
        ``max_tokens``, and a ``k`` beyond that is refused, as upstream's ``TokenizeParams``."""
        keep = request.truncate_prompt_tokens
        if keep is None:
            return prompt
        room = self.engine.max_model_len - (max_tokens or 0)
        if keep > room:
            raise BadRequestError(
                f"truncate_prompt_tokens={keep} cannot be greater than max_model_len - "
                f"max_tokens = {room}. Please request a smaller truncation size.",
                param="truncate_prompt_tokens",
            )
        keep = room if keep == -1 else keep
        ids = prompt.token_ids
        if len(ids) <= keep:
            return prompt
        kept = ids[:keep] if request.truncation_side == "right" else ids[len(ids) - keep :]
        return _Prompt(None, kept)  # the text no longer matches the ids

    def _echo(self, prompt: _Prompt, request: CompletionRequest) -> str:
        """What ``echo`` puts before a choice's text: the prompt's text, decoded from its ids
        when it came as ids or was truncated; nothing with ``return_token_ids``, which carries
        the prompt's ids instead (upstream's rule), and nothing without ``echo``."""
        if not request.echo or request.return_token_ids:
            return ""
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (its config's; the tokenizer's length if the config has none)."""
        return int(self.engine.config.get("vocab_size") or len(self.tokenizer))

    def _check_token_ids(self, token_ids: Sequence[Any]) -> list[int]:
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequestError(
                f"token ids {bad[:5]} are outside the vocabulary (size {self.vocab_size})",
                param="prompt",
            )
        return list(token_ids)

    # ------------------------------------------------------------ prompts

    def _completion_prompts(self, request: CompletionRequest) -> list[_Prompt]:
        prompt = request.prompt
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            items = [prompt]
        else:
            items = list(prompt)
        if not items:
            raise BadRequestError("prompt must not be empty", param="prompt")
        prompts = []
        for item in items:
            if isinstance(item, str):
                ids = self.tokenizer(item, add_special_tokens=request.add_special_tokens).input_ids
                prompts.append(_Prompt(item, list(ids)))
            else:
                prompts.append(_Prompt(None, self._check_token_ids(item)))
        return prompts

    def _chat_prompt(self, request: ChatCompletionRequest | TokenizeChatRequest) -> _Prompt:
        if not request.messages:
            raise BadRequestError("messages must not be empty", param="messages")
        request_kwargs = request.chat_template_kwargs or {}
        own_template = request.chat_template or request_kwargs.get("chat_template")
        if own_template is not None and not self.trust_request_chat_template:
            raise BadRequestError(  # upstream's words
                "Chat template is passed with request, but --trust-request-chat-template is not "
                "set. Refused request with untrusted chat template.",
                param="chat_template",
            )
        # The server's defaults, then the request's own (upstream's precedence); a template
        # among them is the template, never one of its variables.
        template_kwargs = {**self.default_chat_template_kwargs, **request_kwargs}
        kwargs_template = template_kwargs.pop("chat_template", None)
        template = request.chat_template or kwargs_template or self.chat_template
        if template is None and getattr(self.tokenizer, "chat_template", None) is None:
            raise BadRequestError(
                "this model has no chat template (serve --chat-template gives one); use "
                "/v1/completions",
                param="messages",
            )
        documents = getattr(request, "documents", None)
        if documents is not None:
            template_kwargs["documents"] = documents  # for templates written for retrieval
        if request.continue_final_message and request.add_generation_prompt:
            raise BadRequestError(  # upstream's check and words
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                param="continue_final_message",
            )
        conversation = []
        for message in request.messages:
            try:
                content = text_content(message.content)
            except ValueError as exc:
                raise BadRequestError(str(exc), param="messages") from None
            conversation.append({"role": message.role, "content": content or ""})
        try:
            text = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                chat_template=template,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                **template_kwargs,
            )
        except Exception as exc:  # a template may raise on roles it does not know
            raise BadRequestError(f"the chat template failed: {exc}", param="messages") from None
        # The template holds the special tokens already (as LLM.chat): add none unless asked.
        ids = self.tokenizer(text, add_special_tokens=request.add_special_tokens).input_ids
        token_ids = list(ids)
        return _Prompt(text, token_ids)

    # ------------------------------------------------- tokenize, detokenize

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        """Upstream's ``/tokenize``: the ids a prompt or a chat would run with, counted against
        ``max_model_len`` by the client (nothing is refused for its length here, as upstream)."""
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            refuse_unsupported(
                {
                    "tools": bool(request.tools),
                }
            )
            token_ids = self._chat_prompt(request).token_ids
        else:
            encoded = self.tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)
            token_ids = list(encoded.input_ids)
        return TokenizeResponse(
            count=len(token_ids),
            max_model_len=self.engine.max_model_len,
            tokens=token_ids,
            token_strs=(
                self.tokenizer.convert_ids_to_tokens(token_ids)
                if request.return_token_strs
                else None
            ),
        )

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        """Upstream's ``/detokenize``: the text of ids, special tokens kept."""
        self.check_model(request.model)
        token_ids = self._check_token_ids(request.tokens)
        return DetokenizeResponse(prompt=self.tokenizer.decode(token_ids))

    # --------------------------------------------------------- generation

    async def _start(
        self,
        request_id: str,
        prompts: list[_Prompt],
        request: SamplingRequestMixin,
        params: EngineCoreSamplingParams,
        max_tokens: list[int],
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """One engine request per (prompt, sample), merged; choice index = prompt * n + sample."""
        if params.min_tokens > min(max_tokens):
            raise BadRequestError(
                f"min_tokens={params.min_tokens} exceeds the {min(max_tokens)} tokens this "
                "request may generate",
                param="min_tokens",
            )
        generators = []
        stop = request.stop_list()
        for p_index, prompt in enumerate(prompts):
            parent = ParentRequestStats(request.n)
            for sample in range(request.n):
                child = msgspec.structs.replace(
                    params,
                    seed=None if params.seed is None else params.seed + sample,
                    max_tokens=max_tokens[p_index],
                )
                generators.append(
                    self.engine.generate(
                        f"{request_id}-{p_index}-{sample}",
                        prompt.token_ids,
                        child,
                        prompt=prompt.text,
                        stop=stop,
                        include_stop_str_in_output=request.include_stop_str_in_output,
                        skip_special_tokens=request.skip_special_tokens,
                        stream=request.stream,
                        priority=request.priority,
                        parent=parent,
                        cache_salt=request.cache_salt,
                    )
                )
        return merge_async_iterators(generators)

    async def create_completion(
        self, request: CompletionRequest, client_request_id: str | None = None
    ) -> CompletionResponse | AsyncIterator[str]:
        self.check_model(request.model)
        if request.logprobs is not None and request.logprobs < 0:
            # Upstream's CompletionRequest.check_logprobs: no -1 (whole vocabulary) here.
            raise BadRequestError("`logprobs` must be a positive value.", param="logprobs")
        # Echoing with logprobs shows the prompt's too (upstream's to_sampling_params).
        num_prompt_logprobs = request.prompt_logprobs
        if num_prompt_logprobs is None and request.echo:
            num_prompt_logprobs = request.logprobs
        params = self._check_sampling(
            request,
            {
                "suffix": request.suffix,
                "best_of": request.best_of not in (None, 1) and request.best_of,
                "prompt_embeds": request.prompt_embeds is not None,
            },
            num_logprobs=request.logprobs,
            num_prompt_logprobs=num_prompt_logprobs,
        )
        # echo with max_tokens 0 returns the prompt alone: the engine still runs one step (the
        # prompt's logprobs are computed there), whose token is not shown (upstream's rule).
        echo_only = request.echo and request.max_tokens == 0
        wanted = 1 if echo_only else request.max_tokens
        prompts = [self._truncate(p, request, wanted) for p in self._completion_prompts(request)]
        max_tokens = [self._check_length(len(p.token_ids), wanted, "max_tokens") for p in prompts]
        request_id = f"cmpl-{random_uuid()}"
        response_id = _response_id("cmpl", client_request_id or request.request_id, request_id)
        created = int(time.time())
        merged = await self._start(request_id, prompts, request, params, max_tokens)
        prompt_tokens = sum(len(p.token_ids) for p in prompts)
        with_ids = bool(request.return_token_ids)
        echoes = [self._echo(p, request) for p in prompts]

        def scored(output: RequestOutput, echo: bool, offset: int = 0) -> CompletionLogProbs | None:
            """The choice's legacy logprobs: its new tokens', after the prompt's if echoed."""
            out = output.outputs[0]
            token_ids = list(out.token_ids)
            logprobs: Sequence[dict[int, Logprob] | None] | None = out.logprobs
            if echo and logprobs is not None:
                if echo_only:  # the prompt alone: the step's token is not shown
                    token_ids, logprobs = [], []
                token_ids = [*output.prompt_token_ids, *token_ids]
                logprobs = [*(output.prompt_logprobs or []), *logprobs]
            return completion_logprobs(
                token_ids,
                logprobs,
                request.logprobs,
                initial_text_offset=offset,
                as_ids=bool(request.return_tokens_as_token_ids),
                tokenizer=self.tokenizer,
            )

        if not request.stream:
            outputs, completion_tokens, cached = await _collect(merged, request.n)
            choices = []
            for index, output in outputs:
                out = output.outputs[0]
                choice = CompletionResponseChoice(
                    index=index,
                    text=echoes[index // request.n] + ("" if echo_only else out.text),
                    logprobs=scored(output, request.echo),
                    finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason,
                    prompt_logprobs=clamp_prompt_logprobs(output.prompt_logprobs),
                )
                if with_ids:
                    choice.prompt_token_ids = prompts[index // request.n].token_ids
                    choice.token_ids = list(out.token_ids)
                choices.append(choice)
            return CompletionResponse(
                id=response_id,
                created=created,
                model=self.served_model_name,
                choices=choices,
                usage=self._usage(prompt_tokens, completion_tokens, cached),
            )
        # Per choice, the characters streamed so far: where the next chunk's text_offset starts.
        text_offsets: dict[int, int] = {}

        def chunk(index: int, output: RequestOutput) -> CompletionStreamResponse:
            out = output.outputs[0]
            first = index not in text_offsets
            offset = text_offsets.get(index, 0)
            text = out.text
            if first:
                text = echoes[index // request.n] + ("" if echo_only else text)
            text_offsets[index] = offset + len(text)
            logprobs = scored(output, request.echo and first, offset)
            choice = CompletionResponseStreamChoice(
                index=index,
                text=text,
                logprobs=logprobs,
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
            )
            if with_ids:
                if first:
                    choice.prompt_token_ids = prompts[index // request.n].token_ids
                choice.token_ids = list(out.token_ids)
            return CompletionStreamResponse(
                id=response_id,
                object="text_completion",
                created=created,
                model=self.served_model_name,
                choices=[choice],
            )

        usage = CompletionStreamResponse(
            id=response_id,
            object="text_completion",
            created=created,
            model=self.served_model_name,
            choices=[],
        )
        prompt_lens = [len(p.token_ids) for p in prompts]
        return self._stream(merged, chunk, [], usage, prompt_lens, request)

    async def create_chat_completion(
        self, request: ChatCompletionRequest, client_request_id: str | None = None
    ) -> ChatCompletionResponse | AsyncIterator[str]:
        self.check_model(request.model)
        params = self._check_sampling(
            request,
            {
                "tools": bool(request.tools),
                "tool_choice": request.tool_choice not in (None, "none"),
            },
            num_logprobs=chat_num_logprobs(request),
            # Echoing with top_logprobs scores the prompt too (upstream's to_sampling_params).
            num_prompt_logprobs=request.top_logprobs
            if request.prompt_logprobs is None and request.echo
            else request.prompt_logprobs,
        )
        role = chat_request_role(request)
        echo = chat_echo(request, role)
        use_new_name = request.max_completion_tokens is not None
        field = "max_completion_tokens" if use_new_name else "max_tokens"
        wanted = request.max_completion_tokens if use_new_name else request.max_tokens
        prompt = self._truncate(self._chat_prompt(request), request, wanted)
        max_tokens = self._check_length(len(prompt.token_ids), wanted, field)
        request_id = f"chatcmpl-{random_uuid()}"
        response_id = _response_id("chatcmpl", client_request_id or request.request_id, request_id)
        created = int(time.time())
        merged = await self._start(request_id, [prompt], request, params, [max_tokens])
        with_ids = bool(request.return_token_ids)
        as_ids = bool(request.return_tokens_as_token_ids)
        if not request.stream:
            outputs, completion_tokens, cached = await _collect(merged, request.n)
            choices = [(index, output.outputs[0]) for index, output in outputs]
            return ChatCompletionResponse(
                id=response_id,
                created=created,
                model=self.served_model_name,
                choices=[
                    ChatCompletionResponseChoice(
                        index=index,
                        message=ChatResponseMessage(role=role, content=echo + out.text),
                        logprobs=chat_logprobs(
                            out.token_ids, out.logprobs, request.top_logprobs, as_ids=as_ids
                        ),
                        finish_reason=out.finish_reason,
                        stop_reason=out.stop_reason,
                        token_ids=list(out.token_ids) if with_ids else None,
                    )
                    for index, out in choices
                ],
                usage=self._usage(len(prompt.token_ids), completion_tokens, cached),
                prompt_token_ids=prompt.token_ids if with_ids else None,
                prompt_logprobs=clamp_prompt_logprobs(outputs[0][1].prompt_logprobs),
                prompt_text=prompt.text if request.return_prompt_text else None,
            )

        def stream_response(
            choices: list[ChatCompletionResponseStreamChoice],
        ) -> ChatCompletionStreamResponse:
            return ChatCompletionStreamResponse(
                id=response_id,
                object="chat.completion.chunk",
                created=created,
                model=self.served_model_name,
                choices=choices,
            )

        def chunk(index: int, output: RequestOutput | None = None) -> ChatCompletionStreamResponse:
            out = None if output is None else output.outputs[0]
            if out is None:  # the role comes first, once per choice (as OpenAI sends it)
                choice = ChatCompletionResponseStreamChoice(
                    index=index,
                    delta=DeltaMessage(role=role, content=""),
                    logprobs=None,
                    finish_reason=None,
                )
            else:
                choice = ChatCompletionResponseStreamChoice(
                    index=index,
                    delta=DeltaMessage(content=out.text),
                    logprobs=chat_logprobs(
                        out.token_ids, out.logprobs, request.top_logprobs, as_ids=as_ids
                    ),
                    finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason,
                )
                if with_ids:
                    choice.token_ids = list(out.token_ids)
            response = stream_response([choice])
            if out is None:  # each role chunk carries the prompt's ids and text when asked
                if with_ids:
                    response.prompt_token_ids = prompt.token_ids
                if request.return_prompt_text:
                    response.prompt_text = prompt.text
            return response

        first = [chunk(index) for index in range(request.n)]
        if echo:  # then the echoed message, once per choice, as upstream streams it
            first += [
                stream_response(
                    [
                        ChatCompletionResponseStreamChoice(
                            index=index,
                            delta=DeltaMessage(content=echo),
                            logprobs=None,
                            finish_reason=None,
                        )
                    ]
                )
                for index in range(request.n)
            ]
        usage = stream_response([])
        return self._stream(merged, chunk, first, usage, [len(prompt.token_ids)], request)

    def _usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        """The token counts OpenAI clients read for billing; with
        ``--enable-prompt-tokens-details`` and a prefix-cache hit, the prompt tokens read from
        the cache too (upstream's ``PromptTokenUsageInfo``)."""
        usage = _usage(prompt_tokens, completion_tokens)
        if self.enable_prompt_tokens_details and cached_tokens:
            usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=cached_tokens)
        return usage

    async def _stream(
        self,
        merged: AsyncGenerator[tuple[int, RequestOutput], None],
        chunk: Callable[[int, RequestOutput], BaseModel],
        first: Sequence[BaseModel],
        usage: CompletionStreamResponse | ChatCompletionStreamResponse,
        prompt_lens: Sequence[int],
        request: SamplingRequestMixin,
    ) -> AsyncIterator[str]:
        """Server-sent events: ``first``, one chunk per output, the usage chunk if asked, then
        ``[DONE]``.

        The response has started by now (status 200), so a failure becomes an error event in the
        stream; leaving early closes ``merged``, which aborts the unfinished requests. With
        ``stream_options.continuous_usage_stats`` (and ``include_usage``) every chunk also carries
        its own choice's usage so far (upstream's ``should_include_usage``): the prompt of that
        choice and the tokens generated for it, not the sum over choices.
        """
        options = request.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)
        generated: dict[int, int] = {}  # tokens per choice index
        cached: dict[int, int] = {}  # prefix-cache hits per prompt (its first sample's)

        def event(payload: BaseModel) -> str:
            if continuous:
                index = payload.choices[0].index  # type: ignore[attr-defined]
                prompt_tokens = prompt_lens[index // request.n]
                payload.usage = _usage(prompt_tokens, generated.get(index, 0))  # type: ignore[attr-defined]
            return _sse(payload)

        try:
            for opening in first:
                yield event(opening)
            async for index, output in merged:
                completion = output.outputs[0]
                generated[index] = generated.get(index, 0) + len(completion.token_ids)
                if index % request.n == 0:
                    cached[index // request.n] = output.num_cached_tokens or 0
                yield event(chunk(index, output))
            if include_usage:
                usage.usage = self._usage(
                    sum(prompt_lens), sum(generated.values()), sum(cached.values())
                )
                yield _sse(usage)
        except Exception as exc:
            yield _sse_error(exc)
        finally:
            await merged.aclose()
        yield "data: [DONE]\n\n"


async def _collect(
    merged: AsyncGenerator[tuple[int, RequestOutput], None], n: int
) -> tuple[list[tuple[int, RequestOutput]], int, int]:
    """Every choice's final output in index order, the tokens generated over all of them, and
    the prompt tokens read from the prefix cache: each prompt's first sample's hits (its later
    samples hit what it computed; upstream reports the last prompt's alone)."""
    finals = {index: output async for index, output in merged}
    outputs = sorted(finals.items(), key=lambda item: item[0])
    cached = sum(out.num_cached_tokens or 0 for index, out in finals.items() if index % n == 0)
    generated = sum(len(output.outputs[0].token_ids) for _, output in outputs)
    return outputs, generated, cached


def _response_id(prefix: str, client_id: str | None, request_id: str) -> str:
    """The ``id`` of the response: upstream's ``{prefix}-{X-Request-Id header}`` (or of the
    body's ``request_id``) when the client gave one, so that it can find its request in the
    server's answer; the engine's own ids stay ours, unique even if two clients send one id."""
    return f"{prefix}-{client_id}" if client_id else request_id


def chat_request_role(request: ChatCompletionRequest) -> str:
    """The role of the reply: the assistant's, unless the request asked for no generation
    prompt, in which case the model continues the last message and the reply is in its role
    (upstream's ``get_chat_request_role``)."""
    if request.add_generation_prompt:
        return "assistant"
    return request.messages[-1].role


def check_prompt_logprobs(request: SamplingRequestMixin) -> None:
    """Upstream's checks of ``prompt_logprobs``: -1 or at least 0, and not in a stream (0
    passes: it asks for each prompt token's own logprob, which a stream does not show)."""
    asked = request.prompt_logprobs
    if asked is None:
        return
    if request.stream and (asked > 0 or asked == -1):
        raise BadRequestError(
            "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs"
        )
    if asked < 0 and asked != -1:
        raise BadRequestError(
            "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs"
        )


def clamp_prompt_logprobs(prompt_logprobs: PromptLogprobs | None) -> PromptLogprobs | None:
    """JSON has no -inf: such a logprob is written -9999.0, as upstream's (and OpenAI's)."""
    if prompt_logprobs is None:
        return None
    return [
        None
        if position is None
        else {
            token_id: Logprob(max(lp.logprob, -9999.0), lp.rank, lp.decoded_token)
            for token_id, lp in position.items()
        }
        for position in prompt_logprobs
    ]


def chat_echo(request: ChatCompletionRequest, role: str) -> str:
    """What ``echo`` puts before each reply: the last message's text when the reply continues
    it (same role: no generation prompt), else nothing (upstream's rule)."""
    last = request.messages[-1] if request.messages else None
    if not request.echo or last is None or last.role != role:
        return ""
    return text_content(last.content)


def chat_num_logprobs(request: ChatCompletionRequest) -> int | None:
    """The engine's ``logprobs`` for a chat request: ``top_logprobs`` if ``logprobs`` is true.

    As upstream's checks: ``top_logprobs`` is >= 0 or -1, and asking for any without
    ``logprobs: true`` is an error rather than silently nothing.
    """
    top = request.top_logprobs
    if top is not None and top < 0 and top != -1:
        raise BadRequestError("`top_logprobs` must be a positive value or -1.", "top_logprobs")
    if top is not None and top != 0 and not request.logprobs:
        raise BadRequestError(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    return (top or 0) if request.logprobs else None


def _token_name(token_id: int, text: str | None, as_ids: bool) -> str:
    """How logprobs name a token: its text, or ``token_id:{id}`` with
    ``return_tokens_as_token_ids`` (upstream's ``_get_decoded_token``)."""
    return f"token_id:{token_id}" if as_ids else (text or "")


def completion_logprobs(
    token_ids: Sequence[int],
    logprobs: Sequence[dict[int, Logprob] | None] | None,
    num_logprobs: int | None,
    initial_text_offset: int = 0,
    as_ids: bool = False,
    tokenizer: Any = None,
) -> CompletionLogProbs | None:
    """The legacy format: each token's text, its logprob, and a dict of the token and the
    ``num_logprobs`` best (keyed by text, as OpenAI's), with running character offsets. An
    echoed prompt's first token has no logprob (``None``): its text alone, decoded here."""
    if logprobs is None or num_logprobs is None:
        return None
    # Every list passed in, so that a streamed chunk (dumped with exclude_unset) keeps them.
    result = CompletionLogProbs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    offset = initial_text_offset
    for token_id, position in zip(token_ids, logprobs):
        if position is None:
            token = _token_name(token_id, tokenizer.decode([token_id]), as_ids)
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
        else:
            sampled = position[token_id]
            token = _token_name(token_id, sampled.decoded_token, as_ids)
            result.token_logprobs.append(max(sampled.logprob, -9999.0))
            # The token, then the best num_logprobs (a prompt's may hold more: prompt_logprobs).
            best = list(position.items())[: num_logprobs + 1]
            result.top_logprobs.append(
                {
                    _token_name(t, lp.decoded_token, as_ids): max(lp.logprob, -9999.0)
                    for t, lp in best
                }
            )
        result.tokens.append(token)
        result.text_offset.append(offset)
        offset += len(token)
    return result


def chat_logprobs(
    token_ids: Sequence[int],
    logprobs: SampleLogprobs | None,
    top_logprobs: int | None,
    as_ids: bool = False,
) -> ChatCompletionLogProbs | None:
    """The chat format: per token its text, logprob and UTF-8 bytes, and the ``top_logprobs``
    most likely tokens in rank order (the sampled one is listed there only if it is among them).
    """
    if logprobs is None:
        return None
    content = []
    for token_id, position in zip(token_ids, logprobs):
        ranked = sorted(position.items(), key=lambda item: item[1].rank or 0)
        if top_logprobs != -1:
            limit = top_logprobs or 0
            ranked = [(t, lp) for t, lp in ranked if lp.rank is not None and lp.rank <= limit]
        sampled = _chat_logprob(token_id, position[token_id], as_ids)
        # The sampled token's bytes are its text's, also when it is named by its id (upstream).
        sampled.bytes = list((position[token_id].decoded_token or "").encode("utf-8", "replace"))
        content.append(
            ChatCompletionLogProbsContent(
                **sampled.model_dump(),
                top_logprobs=[_chat_logprob(t, lp, as_ids) for t, lp in ranked],
            )
        )
    return ChatCompletionLogProbs(content=content)


def _chat_logprob(token_id: int, lp: Any, as_ids: bool) -> ChatCompletionLogProb:
    token = _token_name(token_id, lp.decoded_token, as_ids)
    return ChatCompletionLogProb(
        token=token,
        logprob=max(lp.logprob, -9999.0),
        bytes=list(token.encode("utf-8", errors="replace")),
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    """The token counts OpenAI clients read for billing; the total is derived, never passed."""
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def _sse(payload: BaseModel) -> str:
    """One event; fields never set are left out, as upstream's chunks
    (``model_dump_json(exclude_unset=True)``): no ``"usage": null`` on every chunk, no
    ``"role": null`` in a content delta."""
    return f"data: {payload.model_dump_json(exclude_unset=True)}\n\n"


def _sse_error(exc: BaseException) -> str:
    from mini_vllm.engine.core_client import EngineDeadError

    if isinstance(exc, EngineDeadError):
        body = error_response(str(exc), "ServiceUnavailableError", 503)
    else:
        body = error_response(str(exc), "InternalServerError", 500)
    return f"data: {ErrorResponse.model_validate(body).model_dump_json()}\n\n"


async def merge_async_iterators(
    generators: Sequence[AsyncGenerator[RequestOutput, None]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Interleave several generators' items as they come, tagged with the generator's index.

    Upstream's ``merge_async_iterators`` (``vllm/utils/async_utils.py``). Closing the merged
    generator (or cancelling its consumer) cancels the pumps, which closes every generator and
    so aborts every request that has not finished: all ``n`` samples leave together.
    """
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(index: int, gen: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for item in gen:
                queue.put_nowait((index, item))
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generators)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
