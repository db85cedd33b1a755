"""Device time per kernel over a window of steps, from ``torch.profiler``.

Upstream's workers wrap ``torch.profiler`` (``vllm/profiler/wrapper.py``) and write a trace per
rank for a human to open. The course wants the figure a benchmark can print instead: how long
each kernel ran on the device, summed over the window, so that "what share of a decode step is
the all-reduce" is one division (NCCL's kernels are named ``ncclDevKernel_...``). Kernels inside
a CUDA-graph replay are recorded one by one, as CUPTI reports graph nodes as kernels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


class KernelProfiler:
    """Start, run some steps, stop: ``{kernel name: (calls, device microseconds)}``."""

    def __init__(self) -> None:
        self._profile: profile | None = None

    def start(self) -> None:
        if self._profile is not None:
            raise RuntimeError("the profiler is already running; stop it first")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities)
        self._profile.__enter__()

    def stop(self) -> dict[str, tuple[int, float]]:
        if self._profile is None:
            raise RuntimeError("the profiler is not running; start it first")
        prof, self._profile = self._profile, None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        return kernel_times(prof)


def kernel_times(prof: Any) -> dict[str, tuple[int, float]]:
    """Calls and total device time (µs) of every device-side event (kernels, memcpys).

    ProcessGroupNCCL also marks the device timeline with a range around each collective
    (``nccl:all_gather``) that spans the kernel it launches; counting both would count the
    collective twice, so these ranges are left out.
    """
    device = torch.autograd.DeviceType.CUDA
    times: dict[str, tuple[int, float]] = {}
    for event in prof.events():
        if event.device_type != device or event.name.startswith("nccl:"):
            continue
        calls, total = times.get(event.name, (0, 0.0))
        times[event.name] = (calls + 1, total + event.device_time_total)
    return times
