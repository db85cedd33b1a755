"""A deterministic simulator of the scheduler and the KV cache, with a fake model.

``python -m mini_vllm.teaching.sim`` prints a step-by-step schedule; the classes below let
tests and notebooks replay workloads and inspect the trace. Nothing here imports
torch. One job per module:

* ``fake_model``: the fake model (``fake_next_token``, ``expected_output``) and
  ``FakeModelRunner``, which executes ``SchedulerOutput``s and checks them;
* ``workload``: seeded request workloads (``RequestSpec``, ``make_workload``);
* ``simulator``: the engine loop and its trace (``SimConfig``, ``Simulator``,
  ``StepRecord``, ``SimResult``);
* ``render``: tables (``print_result``, ``render_plain``).
"""

from mini_vllm.teaching.sim.fake_model import (
    FakeModelRunner,
    RunnerContractError,
    expected_output,
    fake_next_token,
)
from mini_vllm.teaching.sim.render import print_result, render_plain
from mini_vllm.teaching.sim.simulator import SimConfig, SimResult, Simulator, StepRecord
from mini_vllm.teaching.sim.workload import RequestSpec, make_workload

__all__ = [
    "FakeModelRunner",
    "RequestSpec",
    "RunnerContractError",
    "SimConfig",
    "SimResult",
    "Simulator",
    "StepRecord",
    "expected_output",
    "fake_next_token",
    "make_workload",
    "print_result",
    "render_plain",
]
