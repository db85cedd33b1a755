"""The GGUF checkpoint cache: one conversion per file version, whole folders only, a fallback.

The conversion itself is transformers' (checked against the real file in
``test_real_model.py::test_the_cached_conversion_equals_the_gguf_file``); here a stand-in
converter writes a marker, so every rule of the cache is checked in milliseconds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mini_vllm.model import gguf_cache, loader
from mini_vllm.model.loader import ModelSource, resolve_model


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.Q4_1.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF not really")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(root))
    return root


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stand in for ``convert_gguf``: records each conversion and writes a config."""
    made: list[Path] = []

    def convert(source: ModelSource, folder: Path) -> None:
        assert source.gguf_file is not None, "the converter must be given the GGUF file itself"
        (folder / "config.json").write_text("{}")
        made.append(folder)

    monkeypatch.setattr(loader, "convert_gguf", convert)
    return made


def test_a_gguf_file_is_converted_once(gguf: Path, cache: Path, conversions: list[Path]) -> None:
    first = resolve_model(str(gguf))
    second = resolve_model(str(gguf.parent))  # a folder holding one GGUF file: the same file
    assert len(conversions) == 1, "the second load must read the cached folder"
    assert first == second
    assert Path(first.path).parent == cache / "gguf" and Path(first.path).is_dir()
    assert (Path(first.path) / "config.json").is_file()
    assert first.gguf_file is None and first.from_pretrained_kwargs() == {"local_files_only": True}
    assert str(first) == str(gguf), "messages name the file the user gave, not the cache"


def test_an_edited_file_gets_a_new_folder(gguf: Path, cache: Path, conversions: list[Path]):
    before = resolve_model(str(gguf))
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    after = resolve_model(str(gguf))
    assert before.path != after.path and len(conversions) == 2


def test_an_empty_cache_variable_reads_the_file(
    gguf: Path, monkeypatch: pytest.MonkeyPatch, conversions: list[Path]
) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, "")
    assert resolve_model(str(gguf)) == ModelSource(str(gguf.parent), gguf.name)
    assert conversions == []


def test_a_failed_conversion_leaves_nothing_behind(
    gguf: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(source: ModelSource, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"half written")
        raise ValueError("model_type 'qwen2' is not a Llama-family decoder")

    monkeypatch.setattr(loader, "convert_gguf", unsupported)
    with pytest.raises(ValueError, match="Llama-family"):
        resolve_model(str(gguf))
    assert [p for p in (cache / "gguf").iterdir() if p.is_dir()] == []


def test_a_killed_conversion_is_cleared(gguf: Path, cache: Path, conversions: list[Path]):
    folder = gguf_cache.converted_folder(gguf, cache)
    leftover = folder.parent / f".{folder.name}-killed"
    leftover.mkdir(parents=True)
    resolve_model(str(gguf))
    assert not leftover.exists() and folder.is_dir()


def test_an_unwritable_cache_falls_back_to_the_file(
    gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    conversions: list[Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocked / "cache"))
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert resolve_model(str(gguf)) == ModelSource(str(gguf.parent), gguf.name)
    assert conversions == [] and "cannot use the checkpoint cache" in caplog.text


def test_two_processes_loading_at_once_convert_once(gguf: Path, cache: Path, tmp_path: Path):
    """Two engines started together (the server's front end and its engine core, two test
    workers) wait for one conversion instead of each doing it."""
    log = tmp_path / "conversions.log"
    program = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from mini_vllm.model import gguf_cache

        def convert(folder):
            with open({str(log)!r}, "a") as fh:
                fh.write("converted\\n")
            time.sleep(1.0)
            (folder / "config.json").write_text("{{}}")

        print(gguf_cache.converted(Path({str(gguf)!r}), convert))
        """
    )
    env = {**os.environ, gguf_cache.CACHE_ENV: str(cache)}
    argv = [sys.executable, "-c", program]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outputs[0] == outputs[1] == str(gguf_cache.converted_folder(gguf, cache))
    assert log.read_text().splitlines() == ["converted"]
