"""A worker that dies or hangs fails the engine loudly, names the rank, and leaves no process.

Faults are real, not simulated: a worker is killed with SIGKILL, frozen with SIGSTOP, or its
engine process is killed under it. Each test starts its own 2-rank engine (the fault takes it
down) with a short step deadline (``MINI_VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mini_vllm.executor.multiproc_executor import EXECUTE_MODEL_TIMEOUT_ENV, WorkerFailedError
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams
from tests.tp.conftest import process_gone

TIMEOUT_S = 4
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _engine(tiny_tp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    monkeypatch.setenv(EXECUTE_MODEL_TIMEOUT_ENV, str(TIMEOUT_S))
    llm = LLM(str(tiny_tp_dir), tensor_parallel_size=2, skip_tokenizer_init=True, max_model_len=64)
    assert len(llm.generate([[1, 2, 3]], PARAMS, use_tqdm=False)[0].outputs[0].token_ids) == 8
    return llm


def _wait_gone(pids: list[int], within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if all(process_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return all(process_gone(pid) for pid in pids)


def test_a_dead_worker_is_named_and_the_others_stopped(tiny_tp_dir, monkeypatch) -> None:
    llm = _engine(tiny_tp_dir, monkeypatch)
    pids = llm.llm_engine.model_runner.worker_pids
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerFailedError, match=r"rank 1 .*died.*exit code -9") as excinfo:
        llm.generate([[4, 5, 6]], PARAMS, use_tqdm=False)
    assert excinfo.value.ranks == [1]
    assert time.monotonic() - start < TIMEOUT_S + 10
    assert _wait_gone(pids, 5.0)
    with pytest.raises(RuntimeError, match="executor has failed"):  # and it stays failed
        llm.generate([[4, 5, 6]], PARAMS, use_tqdm=False)


def test_a_hung_worker_is_named_within_the_deadline(tiny_tp_dir, monkeypatch) -> None:
    llm = _engine(tiny_tp_dir, monkeypatch)
    pids = llm.llm_engine.model_runner.worker_pids
    os.kill(pids[1], signal.SIGSTOP)  # frozen between steps: it never picks the next one up
    start = time.monotonic()
    try:
        with pytest.raises(WorkerFailedError, match=r"rank\(s\) \[1\] never picked it up") as exc:
            llm.generate([[4, 5, 6]], PARAMS, use_tqdm=False)
    finally:
        for pid in pids:  # never leave a stopped process behind, whatever happened
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
    elapsed = time.monotonic() - start
    assert exc.value.ranks == [1]
    assert "rank(s) [0] started it and are waiting" in str(exc.value)  # in the all-reduce
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 10
    assert _wait_gone(pids, 5.0)


def test_workers_exit_when_their_engine_is_killed(tiny_tp_dir) -> None:
    """SIGKILL runs no cleanup in the engine: the workers notice their death pipe closing."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from mini_vllm.llm import LLM
        if __name__ == "__main__":
            llm = LLM({str(tiny_tp_dir)!r}, tensor_parallel_size=2, skip_tokenizer_init=True,
                      max_model_len=64)
            print(*llm.llm_engine.model_runner.worker_pids, flush=True)
            time.sleep(600)
        """
    )
    engine = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = engine.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, f"the engine did not start: {line!r}"
        assert not any(process_gone(pid) for pid in pids)
    finally:
        engine.kill()
        engine.wait()
    assert _wait_gone(pids, 10.0), "worker processes outlived their engine"


def test_a_failing_worker_reports_its_rank_and_traceback(tiny_tp_dir, monkeypatch) -> None:
    llm = _engine(tiny_tp_dir, monkeypatch)
    executor = llm.llm_engine.model_runner
    pids = executor.worker_pids
    failed = r"worker rank [01] failed in set_max_model_len"
    with pytest.raises(WorkerFailedError, match=failed) as e:
        executor.collective_rpc("set_max_model_len", args=("not a length",))
    assert "Traceback" in str(e.value) and "TypeError" in str(e.value)  # the worker's own
    assert _wait_gone(pids, 5.0)
    with pytest.raises(RuntimeError, match="executor has failed"):
        executor.collective_rpc("describe")


def test_a_refused_cache_leaves_no_worker(tiny_tp_dir) -> None:
    """The budget check runs after the workers started: refusing must stop them."""
    import multiprocessing

    with pytest.raises(ValueError, match="KV cache budget too small"):
        LLM(
            str(tiny_tp_dir),
            tensor_parallel_size=2,
            skip_tokenizer_init=True,
            max_model_len=256,
            kv_cache_memory_bytes=4 * 2048,  # 4 blocks per rank; 256 tokens need 17
        )
    assert multiprocessing.active_children() == []
