"""Fixtures of the engine tests: tiny random Llama checkpoints, written once per session.

The checkpoints are saved by transformers itself (``save_pretrained``), so the engine loads them
through exactly the path it uses for real models. Two shapes cover what the Llama family varies:
``tiny_llama`` (tied embeddings, plain RoPE, GQA 4/2) and ``tiny_llama3`` (untied, llama3 RoPE
scaling, an explicit ``head_dim`` unequal to ``hidden/heads``, projection biases).

Weights are drawn with a large ``initializer_range`` so that logits are spread out: greedy parity
with Hugging Face is then decided by the model, not by float noise between near-tied logits.
"""

from __future__ import annotations

import gc
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY_VOCAB = 128

# The models here are small enough that intra-op threads cost more in synchronisation than
# they gain, and on a loaded machine spinning OpenMP workers slow every small op by 10-50x.
torch.set_num_threads(1)

# Where the engines of these tests run: ``device="auto"`` picks CUDA whenever torch sees a GPU,
# so on a GPU host every engine test here is a GPU test (``make test-gpu``).
ON_CUDA = torch.cuda.is_available()

requires_cuda = pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA device (make test-gpu)")

# On a GPU an engine without a budget takes gpu_memory_utilization (90 %) of the whole device
# for its KV cache, after a profiling run: two such engines cannot be alive at once, and the
# shared engines below are alive all session. They get this explicit budget instead, which also
# skips the profiling run and still holds thousands of blocks of the tiny models.
GPU_KV_CACHE_BYTES = 64 * 2**20


@pytest.fixture(autouse=True)
def _free_gpu_engines() -> Iterator[None]:
    """On a GPU, release a test's own large engine before the next one sizes its KV cache.

    An engine built without a budget takes ``gpu_memory_utilization`` of the whole device for
    its cache, and engines hold reference cycles, so without a collection the next test's
    engine would find the memory still taken and fail to start. Only after a test that left
    more than 256 MiB allocated: a full collection walks every object of the session's shared
    engines (a tenth of a second), which after every test would add up to tens of seconds.
    """
    if not ON_CUDA:
        yield
        return
    allocated = torch.cuda.memory_allocated()
    yield
    if torch.cuda.memory_allocated() - allocated > 256 * 2**20:
        gc.collect()
        torch.cuda.empty_cache()


def kv_block_bytes(hf_config: Any, dtype: str = "auto", block_size: int = 16) -> int:
    """Bytes of one KV block of a checkpoint, in the dtype the engine gives ``dtype`` here.

    ``"auto"`` is float32 on CPU and bfloat16 on a GPU (the engine's own rule, asked through
    ``resolve_dtype``), which halves the block: budgets in these tests are counted in blocks of
    the dtype in use, never in bytes that assume float32.
    """
    from mini_vllm.engine.llm_engine import resolve_device
    from mini_vllm.model.loader import resolve_dtype
    from mini_vllm.worker import kv_sizing

    torch_dtype = resolve_dtype(dtype, hf_config, resolve_device("auto"))
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )
    return kv_sizing.bytes_per_block(
        block_size,
        hf_config.num_hidden_layers,
        hf_config.num_key_value_heads,
        head_dim,
        torch_dtype.itemsize,
    )


class SharedEngines:
    """One engine per distinct configuration for the whole session, handed out as if fresh.

    Building an engine is most of an engine test's time on a GPU (weights to the device, KV
    cache, Triton compilation, CUDA graph capture for every batch size), and many tests differ
    only in what they send to it. ``get`` takes ``LLM``'s keyword arguments; the ones equal to
    ``LLM``'s defaults are left out of the key, so ``async_scheduling=True`` and nothing name the
    same engine. Before an engine is handed out again it is brought back to what a fresh one
    shows: nothing queued or running, an empty prefix cache (an earlier test's prefixes would
    change the schedule and the hit counts), statistics from zero. What stays: request ids keep
    counting (tests compare them relative to their own), the unseeded sampling generator goes
    on (no test compares unseeded draws across engines), and free blocks hold earlier K/V
    instead of zeros (finite values, only ever read masked, as in any long-running engine).
    An engine that cannot be reset (a failed test left requests behind) is replaced.
    A test that changes an engine in another way restores it itself.
    """

    def __init__(self) -> None:
        self._engines: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self.builds = 0

    def get(self, model: Path | str, **kwargs: Any) -> Any:
        from mini_vllm.llm import LLM

        kwargs.setdefault("skip_tokenizer_init", True)
        budget_given = {"kv_cache_memory_bytes", "num_gpu_blocks_override"} & kwargs.keys()
        if ON_CUDA and not budget_given:
            kwargs["kv_cache_memory_bytes"] = GPU_KV_CACHE_BYTES
        defaults = {
            name: p.default for name, p in inspect.signature(LLM.__init__).parameters.items()
        }
        key = (
            str(model),
            tuple(
                sorted((k, repr(v)) for k, v in kwargs.items() if defaults.get(k, object()) != v)
            ),
        )
        llm = self._engines.get(key)
        if llm is not None and not self._reset(llm):
            del self._engines[key]
            llm = None
            gc.collect()
        if llm is None:
            llm = LLM(str(model), **kwargs)
            self._engines[key] = llm
            self.builds += 1
        return llm

    @staticmethod
    def _reset(llm: Any) -> bool:
        from mini_vllm.engine.llm_engine import EngineStats

        engine = llm.llm_engine
        if engine.has_unfinished_requests() or not engine.scheduler.reset_prefix_cache():
            return False
        engine.stats = EngineStats(
            num_gpu_blocks=engine.num_gpu_blocks, block_size=engine.block_size
        )
        return True

    def clear(self) -> None:
        for llm in self._engines.values():
            llm.llm_engine.shutdown()
        self._engines.clear()
        gc.collect()


@pytest.fixture(scope="session")
def engines() -> Iterator[SharedEngines]:
    """The session's shared engines (see :class:`SharedEngines`)."""
    shared = SharedEngines()
    yield shared
    shared.clear()


def _save_tiny(path: Path, seed: int, **overrides: Any) -> Path:
    config_kwargs: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config_kwargs.update(overrides)
    config = transformers.LlamaConfig(**config_kwargs)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny_llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_tiny(
        tmp_path_factory.mktemp("tiny_llama3"),
        seed=1,
        tie_word_embeddings=False,
        head_dim=24,
        attention_bias=True,
        rope_theta=50000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )


def load_hf(path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.float().eval()


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama_dir: Path) -> Any:
    return load_hf(tiny_llama_dir)


@pytest.fixture(scope="session")
def hf_tiny_llama3(tiny_llama3_dir: Path) -> Any:
    return load_hf(tiny_llama3_dir)


def hf_greedy(hf_model: Any, prompt: list[int], max_new_tokens: int, **generate: Any) -> list[int]:
    """Hugging Face's own greedy continuation of one prompt (no padding, no EOS); ``generate``
    holds more of ``generate``'s options (a repetition penalty, logits processors)."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            **generate,
        )
    return out[0, len(prompt) :].tolist()


def random_prompts(n: int, seed: int, min_len: int = 3, max_len: int = 40) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(0, TINY_VOCAB, (k,), generator=gen).tolist() for k in lengths]
