"""The engine: ``LLMEngine`` in-process, ``EngineCore`` in a process of its own, and the front-end.

The request events live here, as upstream's in ``vllm/v1/engine/__init__.py``, and not in
``core.py``: the output processor (lab-10) reads them, and it must import without pyzmq.
"""

from __future__ import annotations

import enum

import msgspec


class EngineCoreEventType(enum.IntEnum):
    """What the core saw happen to a request (upstream's values)."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent(msgspec.Struct, array_like=True, gc=False):
    """A request event stamped with the core's ``time.monotonic()``.

    The front-end subtracts these stamps from each other (queue time) and from its own
    ``time.monotonic()`` (prefill, decode and inference time): the core is a child process on the
    same host, where the monotonic clock (``CLOCK_MONOTONIC``) is one clock for every process.
    """

    type: EngineCoreEventType
    timestamp: float
