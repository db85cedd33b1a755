"""mini-vLLM: the reference engine of the course, mirroring vLLM v0.22.1's V1 engine.

Modules mirror upstream's layout so that the two read side by side. Importing the package is
cheap: the core labs need only numpy, so torch is imported lazily by the code that needs it.
The offline API is importable from the package, as upstream's is from ``vllm``
(``from mini_vllm import LLM, SamplingParams``); each name loads its module on first use.
The names are strings here, never ``import`` statements (not even under ``TYPE_CHECKING``):
the grader stages a lab's import closure, read from the source, and an import of the engine
here would stage the whole engine, with its twins of the labs' tasks, into every lab.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
UPSTREAM_VERSION = "0.22.1"

_EXPORTS = {
    "LLM": "mini_vllm.llm",
    "SamplingParams": "mini_vllm.sampling_params",
    "RequestOutput": "mini_vllm.outputs",
    "CompletionOutput": "mini_vllm.outputs",
    "TokensPrompt": "mini_vllm.engine.llm_engine",
    "TextPrompt": "mini_vllm.engine.llm_engine",
    "PromptType": "mini_vllm.engine.llm_engine",
    "EngineArgs": "mini_vllm.engine.llm_engine",
    "LLMEngine": "mini_vllm.engine.llm_engine",
}

__all__ = [
    "LLM",
    "UPSTREAM_VERSION",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "PromptType",
    "RequestOutput",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first access (PEP 562), so that ``import
    mini_vllm.core...`` in a lab does not pay for torch."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mini_vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
