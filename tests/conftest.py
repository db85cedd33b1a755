"""Settings shared by the repository's own tests."""

from __future__ import annotations

import os

import pytest

# Without an NVIDIA driver, Triton kernels run in its interpreter; the flag must be set before
# anything imports triton, and any test module may be the first to do so.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `make test-gpu` (`pytest --gpu`): the tests that run their engines and kernels on a CUDA device
# whenever torch sees one. They are marked `gpu` here, by path; --gpu keeps only them and refuses
# to start without a device, where every test would otherwise fail on its own.
GPU_TEST_PATHS = (
    "tests/engine/",
    "tests/reference/test_attention_triton.py",
    "tests/reference/test_attention_triton_varlen.py",
    "tests/tp/test_tp_nccl.py",
)

# `make test` runs on two pytest-xdist workers with `--dist loadgroup`. A module- or
# session-scoped fixture (a loaded checkpoint, shared engines, a running server) is built once in
# every worker that runs a test needing it, so each file's tests stay on one worker, and the
# server tests, which share session-scoped servers, on one worker together. The files below are
# independent slow cases (each test grades mutants or a submission in its own processes): they
# are spread test by test, which is what balances the two workers.
SPREAD_FILES = (
    "tests/test_buggy_implementations.py",
    "tests/test_grader_hostile.py",
    "tests/test_autograder.py",
    "tests/test_notebooks.py",
)
SHARED_SESSION_DIRS = {"tests/serve/": "serve"}


def _xdist_group(path: str) -> str | None:
    if path.startswith(SPREAD_FILES):
        return None
    for prefix, group in SHARED_SESSION_DIRS.items():
        if path.startswith(prefix):
            return group
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu",
        action="store_true",
        default=False,
        help="run only the GPU tests (marker gpu) on a CUDA device; fail at once without one",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--gpu"):
        return
    where = "torch is not installed (make setup-full)"
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes"):
        where = "TRITON_INTERPRET is set (no NVIDIA driver here, or it was exported)"
    else:
        try:
            import torch
        except ImportError:
            pass
        else:
            if torch.cuda.is_available():
                return
            where = f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees none"
    raise pytest.UsageError(
        f"no CUDA device: {where}. `make test-gpu` runs the GPU tests on one; `make test` is "
        "the CPU suite."
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            path = item.path.relative_to(config.rootpath).as_posix()
        except ValueError:
            continue
        if path.startswith(GPU_TEST_PATHS):
            item.add_marker(pytest.mark.gpu)
        group = _xdist_group(path)
        if group is not None and config.pluginmanager.hasplugin("xdist"):
            item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("--gpu"):
        others = [item for item in items if item.get_closest_marker("gpu") is None]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if item.get_closest_marker("gpu") is not None]
