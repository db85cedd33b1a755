"""A GGUF checkpoint converted once into a Hugging Face folder, which every later load reads.

transformers parses a GGUF file in pure Python, and the config, the tokenizer and the weights
each parse it again: about 45 s for SmolLM2-135M on two cores, where the same model saved as
safetensors loads in under a second. So the first load converts the file with transformers' own
reader (weights dequantized to float32, as every load dequantizes them anyway) and saves the
config, tokenizer and weights under the cache; later loads, in any process, read that folder.
Upstream reads a GGUF file with its own loader at every start (docs/upstream-fidelity.md).

A folder's name carries the file's path, size and modification time and the transformers
version, so an edited file or another converter gets a new folder, never a stale one. A folder
appears whole or not at all (written under a temporary name, then renamed), and processes that
load the same file at once wait on a lock instead of converting it twice. Where the cache
cannot be written the file is read directly, as without a cache; ``MINI_VLLM_CACHE_DIR=``
(empty) turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

CACHE_ENV = "MINI_VLLM_CACHE_DIR"

logger = logging.getLogger(__name__)


def cache_root() -> Path | None:
    """The cache folder: ``$MINI_VLLM_CACHE_DIR``, else ``~/.cache/mini-vllm``; None when the
    variable is set but empty (no cache)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return Path(configured).expanduser() if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mini-vllm"


def converted_folder(gguf: Path, root: Path) -> Path:
    """Where the conversion of this version of ``gguf`` lives under ``root``."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{version('transformers')}"
    return root / "gguf" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def converted(gguf: Path, convert: Callable[[Path], None]) -> Path | None:
    """The cached Hugging Face folder for ``gguf``, made by ``convert(folder)`` on first use.

    None when there is no usable cache (turned off, or its folder cannot be written): the
    caller then reads the GGUF file itself. An error of ``convert`` other than ``OSError``
    (an unsupported architecture) reaches the caller, with nothing left in the cache.
    """
    root = cache_root()
    if root is None:
        return None
    folder = converted_folder(gguf, root)
    if folder.is_dir():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        logger.warning("cannot use the checkpoint cache %s (%s): reading %s", root, exc, gguf)
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.is_dir():  # converted by another process while this one waited
            return folder
        for left in folder.parent.glob(f".{folder.name}-*"):  # a conversion that was killed
            shutil.rmtree(left, ignore_errors=True)
        logger.info("converting %s once into %s; later loads read that folder", gguf, folder)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            convert(partial)
            partial.rename(folder)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            logger.warning("could not cache %s (%s): reading it directly", gguf, exc)
            return None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return folder
    finally:
        os.close(lock)  # and with it the lock
