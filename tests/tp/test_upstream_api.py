"""The parallel layers and the executor take their arguments as upstream's do.

A vLLM engineer writes ``ColumnParallelLinear(hidden, out)`` expecting a bias (upstream's default,
and ``nn.Linear``'s), and ``executor.collective_rpc("method", 10.0)`` expecting a 10 s timeout
(upstream's second parameter). Where mini-vLLM's signatures differed, such a call silently meant
something else here. No process is started: the layers are built in one process and the
executor's call is sent to a fake worker queue.
"""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from mini_vllm.executor.multiproc_executor import MultiprocExecutor, PendingStep
from mini_vllm.model.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)


def test_parallel_linear_layers_have_a_bias_by_default() -> None:
    """Upstream's four layers default to ``bias=True`` (vllm/model_executor/layers/linear.py)."""
    layers = {
        "ColumnParallelLinear": ColumnParallelLinear(8, 16),
        "MergedColumnParallelLinear": MergedColumnParallelLinear(8, [16, 16]),
        "QKVParallelLinear": QKVParallelLinear(8, 4, 2, 1),
        "RowParallelLinear": RowParallelLinear(16, 8),
    }
    for name, layer in layers.items():
        assert layer.bias is not None, (
            f"{name}(...) without bias= must have a bias, as upstream's and nn.Linear's do "
            "(mini_vllm/model/linear.py; docs/upstream-fidelity.md, linear.py)"
        )
    assert ColumnParallelLinear(8, 16, bias=False).bias is None


def test_row_parallel_reduce_results_is_keyword_only() -> None:
    """Upstream's fourth parameter is ``input_is_parallel``: a positional ``False`` meant for it
    must not turn off this layer's all-reduce."""
    with pytest.raises(TypeError):
        RowParallelLinear(16, 8, True, False)
    assert RowParallelLinear(16, 8, reduce_results=False).reduce_results is False


class _FakeQueue:
    def __init__(self) -> None:
        self.items: list[bytes] = []

    def put(self, payload: bytes) -> None:
        self.items.append(payload)


def test_collective_rpc_takes_the_timeout_second_as_upstream() -> None:
    """``collective_rpc(method, timeout, args, kwargs, non_block, unique_reply_rank)``: upstream's
    order (vllm/v1/executor/abstract.py, ``Executor.collective_rpc``)."""
    executor = object.__new__(MultiprocExecutor)  # no processes: only the call's encoding
    queue = _FakeQueue()
    executor.workers = [type("W", (), {"requests": queue})()]
    executor.is_failed = False
    executor.execute_timeout_s = 300.0
    executor._seq = 0
    executor._method_of = {}

    before = time.monotonic()
    pending = executor.collective_rpc("describe", 5.0, non_block=True)
    assert isinstance(pending, PendingStep)
    assert pending.deadline - before <= 5.0 + 1.0, (
        "the second positional argument of collective_rpc is the timeout, as upstream's "
        f"(deadline {pending.deadline - before:.0f} s away, not 5 s)"
    )
    _, method, args, kwargs, reply_rank = pickle.loads(queue.items[0])
    assert (method, args, kwargs, reply_rank) == ("describe", (), {}, None)

    executor.collective_rpc("profile", None, (True,), None, True, 0)
    _, method, args, _, reply_rank = pickle.loads(queue.items[1])
    assert (method, args, reply_rank) == ("profile", (True,), 0)


def test_the_layers_still_compute_plain_linear_on_one_rank() -> None:
    layer = ColumnParallelLinear(4, 6)
    x = torch.randn(3, 4)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
