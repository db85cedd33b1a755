"""Settings shared by the repository's own tests."""

from __future__ import annotations

import os
from typing import Any

import pytest

# Without an NVIDIA driver, Triton kernels run in its interpreter; the flag must be set before
# anything imports triton, and any test module may be the first to do so.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The converted SmolLM2 checkpoint (mini_vllm/model/gguf_cache.py) is kept in the checkout's
# build/, not the user's home: tests write nothing outside the repository and tmp_path. Set here,
# before xdist starts its workers, so that they, the servers and the notebook kernels they start
# share one conversion; a fresh clone converts once, a later run reads it.
os.environ.setdefault(
    "MINI_VLLM_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "cache"),
)

# `make test-gpu` (`pytest --gpu`): the tests that run their engines and kernels on a CUDA device
# whenever torch sees one. They are marked `gpu` here, by path; --gpu keeps only them and refuses
# to start without a device, where every test would otherwise fail on its own.
GPU_TEST_PATHS = (
    "tests/engine/",
    "tests/reference/test_attention_triton.py",
    "tests/reference/test_attention_triton_varlen.py",
    "tests/tp/test_tp_nccl.py",
)

# `make test` runs on two pytest-xdist workers (`-n 2 --dist loadgroup`), scheduled by
# `pytest_xdist_make_scheduler` below. A module- or session-scoped fixture (a loaded checkpoint,
# shared engines, a running server) is built once in every worker that runs a test needing it, so
# each file's tests go to one worker together, and the server tests, which share session-scoped
# servers, to one worker all together. The files below are independent slow cases (each test
# grades mutants or a submission in its own processes): they are spread test by test, and sent
# first, so that the long ones start early and the small files fill the end of both workers.
SPREAD_FILES = (
    "tests/test_buggy_implementations.py",
    "tests/test_grader_hostile.py",
    "tests/test_autograder.py",
    "tests/test_notebooks.py",
)
SHARED_SESSION_DIRS = {"tests/serve/": "serve"}


def work_unit(nodeid: str) -> str:
    """What ``nodeid`` is scheduled with: the test alone, its directory's group, or its file."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(SPREAD_FILES):
        return nodeid
    for prefix, group in SHARED_SESSION_DIRS.items():
        if path.startswith(prefix):
            return group
    return path


def send_order(unit: str, tests: dict[str, bool]) -> tuple[int, int]:
    """Spread tests first (in collection order), then groups, the largest first."""
    return (0, 0) if unit.startswith(SPREAD_FILES) else (1, -len(tests))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`work_unit`, spread tests first, then the largest groups.

    xdist's own loadgroup reads ``xdist_group`` marks into node-id suffixes, which pytest 9.2's
    node ids no longer take (every test then went out alone, and both workers loaded the real
    model and started the servers); grouping by path in the controller needs no marks at all.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: Any) -> None:
            super().__init__(config, log)
            self.ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # once, before the first unit goes out
                units = sorted(self.workqueue.items(), key=lambda unit: send_order(*unit))
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return ByWorkUnit(config, log)


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
    if config.getoption("--gpu"):
        others = [item for item in items if item.get_closest_marker("gpu") is None]
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if item.get_closest_marker("gpu") is not None]
