"""The engine loop: requests in, one scheduler step at a time, finished outputs out.

Mirrors ``vllm/v1/engine/llm_engine.py`` (``LLMEngine``) together with the engine core it drives
in-process (``vllm/v1/engine/core.py``), as one object so that one ``step()`` reads top to
bottom. The step and the startup order: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, final

import torch

from mini_vllm.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.core.sched.async_scheduler import AsyncScheduler
from mini_vllm.core.sched.output import EngineCoreOutput, SchedulerOutput
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.distributed.sharding import check_tensor_parallel_size
from mini_vllm.engine.detokenizer import (
    INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET,
    IncrementalDetokenizer,
)
from mini_vllm.engine.logprobs import LogprobsProcessor
from mini_vllm.executor.abstract import Executor
from mini_vllm.executor.multiproc_executor import MultiprocExecutor, get_open_port
from mini_vllm.logprobs import LogprobsLists
from mini_vllm.model.llama import LlamaForCausalLM
from mini_vllm.model.loader import (
    get_model,
    load_checkpoint,
    load_hf_config,
    load_tokenizer,
    resolve_dtype,
    resolve_model,
)
from mini_vllm.outputs import CompletionOutput, RequestOutput
from mini_vllm.request import FinishReason, Request, RequestStatus
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.worker import kv_sizing
from mini_vllm.worker.model_runner import ModelRunner, ModelRunnerOutput
from mini_vllm.worker.worker import WorkerConfig

logger = logging.getLogger(__name__)


class _TokenIds(TypedDict):
    prompt_token_ids: list[int]


# Final: no other keys, so that `"prompt_token_ids" in prompt` tells the two apart (for mypy too).
@final
class TokensPrompt(_TokenIds, total=False):
    """A prompt given as token ids (upstream: ``vllm.inputs.TokensPrompt``); ``prompt``, the
    text they were made from when known (``LLM.chat``'s rendered template), becomes
    ``RequestOutput.prompt`` and is not tokenized again. ``cache_salt`` as ``TextPrompt``'s.
    Optional through ``total=False``: ``NotRequired`` needs Python 3.11."""

    prompt: str
    cache_salt: str


class _Text(TypedDict):
    prompt: str


@final
class TextPrompt(_Text, total=False):
    """A prompt given as text (upstream: ``vllm.inputs.TextPrompt``). ``cache_salt``: only
    requests with the same salt share prefix-cache blocks (upstream's multi-tenant guard)."""

    cache_salt: str


PromptType = str | TextPrompt | TokensPrompt


@dataclass
class EngineArgs:
    """Every knob of the engine, with ``LLM``'s defaults (upstream: ``vllm/engine/arg_utils.py``).

    ``max_num_batched_tokens=None``: 8192 with chunked prefill (upstream's offline budget), else
    at least ``max_model_len`` (an unchunked prompt must fit one step). ``max_model_len=None``:
    the checkpoint's; ``-1``: the checkpoint's, lowered to what the KV cache holds.
    """

    model: str | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    enforce_eager: bool = False
    seed: int = 0
    skip_tokenizer_init: bool = False
    # Plan step N+1 while step N runs (upstream's default at the pin); see AsyncScheduler.
    async_scheduling: bool = True
    # Admit a waiting request only if its whole sequence fits (upstream's default at the pin).
    scheduler_reserve_full_isl: bool = True
    # "fcfs" or "priority" (requests then carry a priority; smaller runs first).
    scheduling_policy: str = "fcfs"
    # Ranks the model is split over (phase 07): 1 runs in this process, N > 1 in N workers.
    tensor_parallel_size: int = 1
    # Most logprobs a request may ask for (upstream's default; -1: the whole vocabulary).
    max_logprobs: int = 20


@dataclass
class EngineStats:
    """Lifetime counters for logs, the CLI and the benchmarks.

    ``kv_blocks_used_peak`` excludes cached-but-free blocks; the prefix-cache counters count
    prompt tokens of new requests only (resumed ones excluded, as upstream).
    """

    num_gpu_blocks: int = 0
    block_size: int = 0
    kv_blocks_used: int = 0
    kv_blocks_used_peak: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the prefix cache (0.0 before any lookup)."""
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries


class EngineKVCacheManager(KVCacheManager):
    """Lab-07's manager plus upstream's ``skip_reading_prefix_cache`` check in
    ``get_computed_blocks``: a request that asks for prompt logprobs must compute every prompt
    token, so it reads no cached prefix (its own blocks are still published). Kept here rather
    than in lab-07's file, whose graded contract does not have prompt logprobs."""

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        if request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        return super().get_computed_blocks(request)


@dataclass
class _RequestRecord:
    request: Request
    prompt: str | None
    num_cached_tokens: int | None = None
    # The logprob rows of each step, kept raw: decoded into dicts once, by _make_completion.
    logprob_rows: list[LogprobsLists] = field(default_factory=list)
    # Prompt logprobs, one row per prompt token from the second, as the chunks compute them.
    prompt_logprob_rows: list[LogprobsLists] = field(default_factory=list)
    num_prompt_logprobs: int = 0  # rows received: a recomputed chunk's repeats are dropped
    # Only for requests with stop strings: their text must be read as it grows.
    detokenizer: IncrementalDetokenizer | None = None
    # A sample of an n > 1 request: its parent's id and its index among the n.
    parent_id: str | None = None
    index: int = 0


@dataclass
class _ParentRecord:
    """An ``n > 1`` request (upstream's ``ParentRequest``): ``n`` samples run as requests
    ``"{index}_{request_id}"``, and one ``RequestOutput`` holds them all when the last ends."""

    child_ids: list[str]
    completions: dict[int, CompletionOutput] = field(default_factory=dict)
    num_cached_tokens: int | None = None


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else is taken literally."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device")
    return resolved


class LLMEngine:
    """Owns the tokenizer, the model runner, the KV cache manager and the scheduler."""

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = resolve_device(args.device)
        source = resolve_model(args.model)
        self.model_source = source

        t0 = time.perf_counter()
        weights: dict[str, torch.Tensor] | None = None
        # None with several ranks: only the workers hold the model, each a shard.
        self.model: LlamaForCausalLM | None = None
        if args.tensor_parallel_size == 1:
            self.model, self.hf_config = get_model(source, self.device, args.dtype)
            self.dtype = next(self.model.parameters()).dtype
        else:
            # Check the split before reading any weight; the workers shard this one copy.
            check_tensor_parallel_size(load_hf_config(source), args.tensor_parallel_size)
            weights, self.hf_config = load_checkpoint(source)
            self.dtype = resolve_dtype(args.dtype, self.hf_config, self.device)
        self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(source)
        logger.info(
            "loaded %s (%s layers, %s on %s) in %.1f s",
            source,
            self.hf_config.num_hidden_layers,
            self.dtype,
            self.device,
            time.perf_counter() - t0,
        )
        self.vocab_size = int(self.hf_config.vocab_size)
        self.max_logprobs = args.max_logprobs
        self.max_model_len = self._resolve_max_model_len(args.max_model_len)
        self.max_num_batched_tokens = args.max_num_batched_tokens or (
            8192 if args.enable_chunked_prefill else max(8192, self.max_model_len)
        )
        self.max_num_seqs = args.max_num_seqs
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Each running request takes at least one token of the step's budget.
            logger.info(
                "max_num_seqs lowered from %d to max_num_batched_tokens=%d",
                self.max_num_seqs,
                self.max_num_batched_tokens,
            )
            self.max_num_seqs = self.max_num_batched_tokens
        self.block_size = args.block_size
        self.eos_token_id, self._generation_config = self._eos_config()

        # The runner's shape, the same whether it runs here or in every worker process.
        runner_shape: dict[str, Any] = {
            "block_size": args.block_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enforce_eager": args.enforce_eager,
            "seed": args.seed,
        }
        if weights is None:
            assert self.model is not None  # one rank: loaded above, in this process
            self.model_runner: Executor = ModelRunner(self.model, self.device, **runner_shape)
        else:
            # The executor offers the runner's calls; each worker process runs a ModelRunner.
            self.model_runner = self._make_executor(weights, runner_shape)
            del weights
        try:
            self.num_gpu_blocks = self._initialize_kv_cache()
            self.model_runner.warm_up_model()
            self.model_runner.capture_model()
        except BaseException:
            self.shutdown()  # a refused cache must not leave worker processes behind
            raise

        self.kv_cache_manager = EngineKVCacheManager(
            self.num_gpu_blocks,
            args.block_size,
            self.max_model_len,
            enable_caching=args.enable_prefix_caching,
            log_stats=True,
        )
        scheduler_cls = AsyncScheduler if args.async_scheduling else Scheduler
        self.scheduler = scheduler_cls(
            self.kv_cache_manager,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            scheduler_reserve_full_isl=args.scheduler_reserve_full_isl,
            policy=args.scheduling_policy,
        )
        self.block_hasher = (
            get_request_block_hasher(args.block_size, sha256)
            if args.enable_prefix_caching
            else None
        )
        self.stats = EngineStats(num_gpu_blocks=self.num_gpu_blocks, block_size=args.block_size)
        self._records: dict[str, _RequestRecord] = {}
        self._parents: dict[str, _ParentRecord] = {}
        # Async scheduling: the step launched and not yet collected, with the runner's handle.
        self._in_flight: tuple[SchedulerOutput, Any] | None = None
        # The scheduler's per-request outputs of the last step (see _update_from_output).
        self.last_core_outputs: list[Any] = []
        # The prompt logprobs that became whole in the last step, by request: they ride on the
        # request's first output over the wire (EngineCore), as upstream's.
        self.last_prompt_logprobs: dict[str, LogprobsLists] = {}
        # Called with every SchedulerOutput as it is made (the engine core stamps its events).
        self.on_schedule: Callable[[SchedulerOutput], None] | None = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (also done when the engine is collected)."""
        if isinstance(self.model_runner, MultiprocExecutor):
            self.model_runner.shutdown()

    def _make_executor(
        self, weights: dict[str, torch.Tensor], runner_shape: dict[str, Any]
    ) -> MultiprocExecutor:
        """Start one worker process per rank (phase 07); each builds its shard of the model."""
        world_size = self.args.tensor_parallel_size
        if self.device.type == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} needs one GPU per rank, but "
                f"torch sees {torch.cuda.device_count()}"
            )
        config = WorkerConfig(
            world_size=world_size,
            distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}",
            device_type=self.device.type,
            dtype=str(self.dtype).removeprefix("torch."),
            **runner_shape,
        )
        return MultiprocExecutor(config, self.hf_config, weights)

    def _resolve_max_model_len(self, max_model_len: int | None) -> int:
        limit = int(getattr(self.hf_config, "max_position_embeddings", 0) or 0)
        # -1: start from the checkpoint's length; _initialize_kv_cache fits it to the cache.
        self._auto_fit_max_model_len = max_model_len == -1
        if max_model_len is None or max_model_len == -1:
            if not limit:
                raise ValueError(
                    "the checkpoint does not state its context length; pass max_model_len"
                )
            return limit
        if max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 (one prompt and one output token), got {max_model_len}"
            )
        if limit and max_model_len > limit:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}"
            )
        return max_model_len

    def _eos_config(self) -> tuple[int | None, dict[str, Any]]:
        """The primary EOS id (the tokenizer's), and the generation config whose other EOS ids
        become stop tokens: ``generation_config.json`` where the checkpoint has one (Llama 3
        Instruct lists ``<|eot_id|>`` there only), else the model config's, as upstream's
        ``try_get_generation_config``."""
        config_eos = getattr(self.hf_config, "eos_token_id", None)
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        if eos is None and isinstance(config_eos, list):
            eos = config_eos[0] if config_eos else None
        elif eos is None:
            eos = config_eos
        generation_config = {"eos_token_id": config_eos}
        path = os.path.join(self.model_source.path, "generation_config.json")
        if self.model_source.gguf_file is None and os.path.isfile(path):
            with open(path) as f:
                generation_config = {"eos_token_id": json.load(f).get("eos_token_id")}
        return eos, generation_config

    def _initialize_kv_cache(self) -> int:
        """Decide the block count from the memory budget, check it, allocate the cache.

        As upstream's ``check_enough_kv_cache_memory``, a cache that cannot hold one request of
        ``max_model_len`` tokens refuses to start: it would accept prompts it can never finish.
        """
        args = self.args
        runner = self.model_runner
        budget = runner.determine_available_memory(
            args.gpu_memory_utilization, args.kv_cache_memory_bytes
        )
        block_bytes = runner.kv_cache_block_bytes
        num_gpu_blocks = kv_sizing.may_override_num_blocks(
            kv_sizing.num_gpu_blocks_from_budget(budget, block_bytes),
            args.num_gpu_blocks_override,
        )
        if self._auto_fit_max_model_len:
            self._fit_max_model_len(num_gpu_blocks)
        # One block is the null block (never handed out); the rest must cover a full request.
        needed = kv_sizing.min_num_gpu_blocks(self.max_model_len, args.block_size)
        if num_gpu_blocks < needed:
            raise ValueError(
                f"KV cache budget too small: {max(budget, 0) / 2**20:.1f} MiB holds "
                f"{num_gpu_blocks} blocks of {args.block_size} tokens "
                f"({block_bytes / 2**10:.1f} KiB each), but one request of "
                f"max_model_len={self.max_model_len} tokens needs {needed} blocks (null block "
                f"included), i.e. {needed * block_bytes / 2**20:.1f} MiB. Raise "
                "kv_cache_memory_bytes (or gpu_memory_utilization), or lower max_model_len."
            )
        runner.initialize_kv_cache(num_gpu_blocks)
        logger.info(
            "KV cache: %d blocks x %d tokens (%.1f KiB/block, %.1f MiB total); maximum "
            "concurrency for %d tokens per request: %.2fx",
            num_gpu_blocks,
            args.block_size,
            block_bytes / 2**10,
            num_gpu_blocks * block_bytes / 2**20,
            self.max_model_len,
            kv_sizing.max_concurrency(num_gpu_blocks, args.block_size, self.max_model_len),
        )
        return num_gpu_blocks

    def _fit_max_model_len(self, num_gpu_blocks: int) -> None:
        """``max_model_len=-1``: lower the checkpoint's length to what the cache holds.

        Upstream's ``_auto_fit_max_model_len``. The runner was built for the longer length; its
        block-table width shrinks with it, before the warm-up and graph capture.
        """
        fitted = kv_sizing.auto_fit_max_model_len(
            num_gpu_blocks, self.args.block_size, self.max_model_len
        )
        if fitted < 2:
            raise ValueError(
                f"max_model_len fitted to the KV cache is {fitted}: at least 2 (one prompt and "
                "one output token) is needed. Give the cache more memory."
            )
        if fitted == self.max_model_len:
            logger.info("max_model_len=%d: the whole context length fits the KV cache", fitted)
            return
        logger.info(
            "max_model_len fitted to the KV cache: %d -> %d tokens (%d blocks)",
            self.max_model_len,
            fitted,
            num_gpu_blocks,
        )
        self.max_model_len = fitted
        self.model_runner.set_max_model_len(fitted)

    def get_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("the engine was created with skip_tokenizer_init=True")
        return self.tokenizer

    def _tokenize(self, prompt: PromptType | list[int]) -> tuple[str | None, list[int]]:
        text = prompt
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            text = prompt["prompt"]
        elif isinstance(prompt, list | tuple):
            return None, [int(t) for t in prompt]
        if not isinstance(text, str):
            raise TypeError(
                f"a prompt is a str, a {{'prompt_token_ids': [...]}} dict, not {prompt!r}"
            )
        if self.tokenizer is None:
            raise ValueError(
                "text prompts need a tokenizer, but skip_tokenizer_init=True; pass "
                "{'prompt_token_ids': [...]} instead"
            )
        return text, list(self.tokenizer(text).input_ids)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        *,
        eos_token_id: int | None = None,
    ) -> str:
        """Validate, tokenize and queue one prompt (under the priority policy, smaller
        ``priority`` runs first); nothing runs until ``step``. ``n > 1`` queues ``n`` samples
        of it (``_ParentRecord``), each with ``seed + index`` when seeded, as upstream.

        ``eos_token_id`` overrides the engine's: the engine core has no tokenizer, so the
        front-end sends its tokenizer's with each request (upstream's
        ``EngineCoreRequest.eos_token_id``)."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in self._records or request_id in self._parents:
            raise ValueError(f"duplicate request id {request_id!r}")
        text, token_ids = self._tokenize(prompt)
        cache_salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(
                f"request {request_id!r}: cache_salt must be a non-empty str, got {cache_salt!r}"
            )
        if not token_ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"request {request_id!r}: the prompt has {len(token_ids)} tokens, but "
                f"max_model_len={self.max_model_len} must leave room for at least one output "
                "token; shorten the prompt or raise max_model_len"
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request_id!r}: token ids {bad[:5]} are outside the vocabulary "
                f"(size {self.vocab_size})"
            )
        params = (params or SamplingParams()).clone()
        try:
            params.verify_logprobs(self.max_logprobs, self.vocab_size)
            params.verify_token_ids(self.vocab_size)
        except ValueError as exc:
            raise ValueError(f"request {request_id!r}: {exc}") from None
        if params.stop and self.tokenizer is None:
            raise ValueError(
                f"request {request_id!r}: stop strings are matched on the text, which needs a "
                "tokenizer, but skip_tokenizer_init=True; use stop_token_ids"
            )
        if params.bad_words:
            if self.tokenizer is None:
                raise ValueError(
                    f"request {request_id!r}: bad_words are tokenized, which needs a "
                    "tokenizer, but skip_tokenizer_init=True"
                )
            try:
                params.update_from_tokenizer(self.tokenizer, self.vocab_size)
            except ValueError as exc:
                raise ValueError(f"request {request_id!r}: {exc}") from None
        eos = self.eos_token_id if eos_token_id is None else eos_token_id
        params.update_from_generation_config(self._generation_config, eos)
        if params.n == 1:
            self._queue(
                request_id, text, token_ids, params, eos, arrival_time, priority, cache_salt
            )
            return request_id
        child_ids = [f"{index}_{request_id}" for index in range(params.n)]
        taken = [child_id for child_id in child_ids if child_id in self._records]
        if taken:
            raise ValueError(f"request {request_id!r}: its samples' ids {taken} are in use")
        self._parents[request_id] = _ParentRecord(child_ids)
        for index, child_id in enumerate(child_ids):
            child = params.clone()
            child.n = 1
            if params.seed is not None:
                child.seed = params.seed + index
            record = self._queue(
                child_id, text, token_ids, child, eos, arrival_time, priority, cache_salt
            )
            record.parent_id, record.index = request_id, index
        return request_id

    def _queue(
        self,
        request_id: str,
        text: str | None,
        token_ids: list[int],
        params: SamplingParams,
        eos: int | None,
        arrival_time: float | None,
        priority: int,
        cache_salt: str | None,
    ) -> _RequestRecord:
        request = Request(
            request_id,
            token_ids,
            params,
            eos_token_id=eos,
            arrival_time=arrival_time,
            block_hasher=self.block_hasher,
            priority=priority,
            cache_salt=cache_salt,
        )
        self.scheduler.add_request(request)
        detokenizer = None
        if params.stop:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                token_ids,
                skip_special_tokens=params.skip_special_tokens,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                min_tokens=params.min_tokens,
            )
        record = self._records[request_id] = _RequestRecord(request, text, detokenizer=detokenizer)
        self.stats.num_prompt_tokens += len(token_ids)
        return record

    def abort_request(self, request_ids: list[str]) -> None:
        """Drop requests wherever they are (queued or running); their blocks are freed. An
        ``n > 1`` request's id drops all its samples."""
        ids: list[str] = []
        for request_id in request_ids:
            parent = self._parents.pop(request_id, None)
            ids.extend(parent.child_ids if parent is not None else [request_id])
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for request_id in ids:
            self._records.pop(request_id, None)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return the requests that finished in it.

        Only finished requests are reported (upstream's ``FINAL_ONLY``; an ``n > 1`` request
        once its last sample has finished): detokenizing every request at every step would cost
        more than the step on a small model, so only a request with stop strings is. With async
        scheduling a call launches the next step before it collects the previous one, so the
        host's Python overlaps the GPU's work; a request that stops on the token collected has
        been launched once more, and that extra token is discarded, as upstream does.
        """
        if not self.args.async_scheduling:
            scheduler_output = self._schedule()
            runner_output = self.model_runner.execute_model(scheduler_output)
            return self._update_from_output(scheduler_output, runner_output)

        runner = self.model_runner
        if self._in_flight is None:
            scheduler_output = self._schedule()
            self._in_flight = (
                scheduler_output,
                runner.launch_step(runner.prepare_step(scheduler_output)),
            )
        scheduler_output, pending = self._in_flight
        # The GPU is busy with `scheduler_output`; plan, flatten and queue the next step behind
        # it. Its requests count the tokens being sampled now as placeholders (AsyncScheduler).
        next_output = self.scheduler.schedule()
        self._record_schedule(next_output)
        self._in_flight = None  # an empty schedule: the next call schedules afresh
        if next_output.total_num_scheduled_tokens:
            prepared = runner.prepare_step(next_output, in_flight=pending)
            self._in_flight = (next_output, runner.launch_step(prepared))
        runner_output = runner.get_output(pending)
        return self._update_from_output(scheduler_output, runner_output)

    def _schedule(self) -> SchedulerOutput:
        scheduler_output = self.scheduler.schedule()
        self._record_schedule(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0 and self.has_unfinished_requests():
            running, waiting = self.scheduler.get_request_counts()
            raise RuntimeError(
                f"the scheduler could schedule nothing ({running} running, {waiting} waiting, "
                f"{self.kv_cache_manager.block_pool.get_num_free_blocks()} free blocks)"
            )
        return scheduler_output

    def _update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output.to_dict())
        if runner_output.logprobs is not None:
            self._attach_logprobs(core_outputs, runner_output)
        self.last_prompt_logprobs = {}
        for req_id, (first_position, rows) in runner_output.prompt_logprobs_dict.items():
            self._keep_prompt_logprobs(req_id, first_position, rows)
        # Every request's new tokens of this step, finished or not, for EngineCore to stream.
        self.last_core_outputs = core_outputs
        prefix_stats = self.kv_cache_manager.make_prefix_cache_stats()
        if prefix_stats is not None:
            self.stats.prefix_cache_queries += prefix_stats.queries
            self.stats.prefix_cache_hits += prefix_stats.hits

        outputs: list[RequestOutput] = []
        for core_output in core_outputs:
            self.stats.num_generation_tokens += len(core_output.new_token_ids)
            request_id = core_output.request_id
            record = self._records.get(request_id)
            if record is None:
                continue
            finish_reason = core_output.finish_reason
            stop_reason = record.request.stop_reason
            if record.detokenizer is not None:
                stop_str = record.detokenizer.update(
                    core_output.new_token_ids,
                    finished=core_output.finished,
                    stop_terminated=finish_reason == FinishReason.STOP,
                )
                if stop_str is not None:  # the text shows a stop string: the request ends here
                    if not core_output.finished:
                        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_STOPPED)
                    finish_reason, stop_reason = FinishReason.STOP, stop_str
            if finish_reason is None:
                continue
            del self._records[request_id]
            output = self._finish(record, self._make_completion(record, finish_reason, stop_reason))
            if output is not None:
                outputs.append(output)
        self.stats.num_steps += 1
        return outputs

    def _attach_logprobs(
        self, core_outputs: list[EngineCoreOutput], runner_output: ModelRunnerOutput
    ) -> None:
        """Give each output that asked for logprobs the rows of the tokens it kept (upstream
        does it in ``Scheduler.update_from_output``; our lab-08 scheduler takes plain tokens)."""
        assert runner_output.logprobs is not None
        for core_output in core_outputs:
            record = self._records.get(core_output.request_id)
            if record is None or record.request.sampling_params.logprobs is None:
                continue
            if not core_output.new_token_ids:
                continue
            req_index = runner_output.req_id_to_index[core_output.request_id]
            core_output.new_logprobs = runner_output.logprobs.slice_request(
                req_index, len(core_output.new_token_ids)
            )
            record.logprob_rows.append(core_output.new_logprobs)

    def _keep_prompt_logprobs(self, req_id: str, first_position: int, rows: LogprobsLists) -> None:
        """Keep a chunk's prompt logprobs: rows for prompt tokens ``first_position + 1`` on. A
        preempted request computes its prompt again from the start (it reads no cached prefix),
        so rows already kept are dropped."""
        record = self._records.get(req_id)
        if record is None:
            return
        skip = record.num_prompt_logprobs - first_position
        assert skip >= 0, f"request {req_id!r}: prompt logprobs from {first_position + 1} missing"
        if skip < len(rows.sampled_token_ranks):
            kept = LogprobsLists(
                rows.logprob_token_ids[skip:], rows.logprobs[skip:], rows.sampled_token_ranks[skip:]
            )
            record.prompt_logprob_rows.append(kept)
            record.num_prompt_logprobs += len(kept.sampled_token_ranks)
            if record.num_prompt_logprobs == len(record.request.prompt_token_ids) - 1:
                self.last_prompt_logprobs[req_id] = _concatenate(record.prompt_logprob_rows)

    def _record_schedule(self, scheduler_output: SchedulerOutput) -> None:
        for new_req in scheduler_output.scheduled_new_reqs:
            record = self._records.get(new_req.req_id)
            if record is not None and record.num_cached_tokens is None:
                record.num_cached_tokens = new_req.num_computed_tokens
        self.stats.num_preemptions += len(scheduler_output.preempted_req_ids)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        used = self.num_gpu_blocks - 1 - free
        self.stats.kv_blocks_used = used
        self.stats.kv_blocks_used_peak = max(self.stats.kv_blocks_used_peak, used)
        if self.on_schedule is not None:
            self.on_schedule(scheduler_output)

    def _make_completion(
        self, record: _RequestRecord, finish_reason: FinishReason, stop_reason: int | str | None
    ) -> CompletionOutput:
        request = record.request
        params = request.sampling_params
        if record.detokenizer is not None:
            token_ids = list(record.detokenizer.output_token_ids)
            text = record.detokenizer.get_next_output_text(finished=True, delta=False)
        else:
            token_ids = list(request.output_token_ids)
            text = ""
            if self.tokenizer is not None:
                text = decode_final_output(
                    self.tokenizer,
                    request.prompt_token_ids,
                    token_ids,
                    stop_terminated=request.status == RequestStatus.FINISHED_STOPPED,
                    skip_special_tokens=params.skip_special_tokens,
                    include_stop_token=params.include_stop_str_in_output,
                )
        logprobs = LogprobsProcessor(self.tokenizer, params.logprobs)
        for rows in record.logprob_rows:
            logprobs.update_sample_logprobs(rows)
        return CompletionOutput(
            index=record.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=logprobs.cumulative_logprob,
            logprobs=logprobs.logprobs,
            finish_reason=str(finish_reason),
            stop_reason=stop_reason,
        )

    def _finish(self, record: _RequestRecord, completion: CompletionOutput) -> RequestOutput | None:
        """The request's output; for a sample of ``n``, None until the last sample ends."""
        request = record.request
        request_id, completions = request.request_id, [completion]
        num_cached_tokens = record.num_cached_tokens
        scored = LogprobsProcessor(self.tokenizer, None, request.sampling_params.prompt_logprobs)
        for rows in record.prompt_logprob_rows:
            scored.update_prompt_logprobs(rows)
        prompt_logprobs = scored.prompt_logprobs
        if record.parent_id is not None:
            parent = self._parents[record.parent_id]
            parent.completions[record.index] = completion
            if record.index == 0:
                parent.num_cached_tokens = record.num_cached_tokens
            if len(parent.completions) < len(parent.child_ids):
                return None
            del self._parents[record.parent_id]
            request_id, num_cached_tokens = record.parent_id, parent.num_cached_tokens
            completions = [parent.completions[i] for i in range(len(parent.child_ids))]
        return RequestOutput(
            request_id=request_id,
            prompt=record.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=completions,
            finished=True,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=num_cached_tokens,
        )


def _concatenate(parts: list[LogprobsLists]) -> LogprobsLists:
    """One request's rows from several steps, in order, as one ``LogprobsLists``."""
    return LogprobsLists(
        [row for part in parts for row in part.logprob_token_ids],
        [row for part in parts for row in part.logprobs],
        [rank for part in parts for rank in part.sampled_token_ranks],
    )


def decode_final_output(
    tokenizer: Any,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    *,
    stop_terminated: bool,
    skip_special_tokens: bool = True,
    include_stop_token: bool = False,
) -> str:
    """The text of a finished request, as upstream's detokenizer leaves it: the output decoded
    after the prompt's last tokens (a SentencePiece token's leading space depends on what
    precedes it), without the EOS or stop token id that ended it (``stop_terminated``) unless
    ``include_stop_token`` (upstream's ``include_stop_str_in_output``). Two decodes in all, the
    incremental detokenizer's window opened once over the whole output."""
    if stop_terminated and not include_stop_token:
        output_token_ids = output_token_ids[:-1]
    if not output_token_ids:
        return ""
    context = list(prompt_token_ids[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:])
    prefix_text = tokenizer.decode(context, skip_special_tokens=skip_special_tokens)
    full_text = tokenizer.decode(
        context + list(output_token_ids), skip_special_tokens=skip_special_tokens
    )
    return full_text[len(prefix_text) :]
