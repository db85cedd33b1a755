"""Without a GPU the lab-04 kernels run in Triton's interpreter, on CPU tensors.

``@triton.jit`` chooses between compiling and interpreting when it decorates a kernel, that is
when the learner's module is imported, in the learner process. That process takes
``TRITON_INTERPRET`` from the judge's environment when it starts (``grading/sandbox.py`` lets
it through), so it must be set here, before any test starts one: pytest imports this file
before any test module. With a GPU nothing is set and the kernels are compiled for it.
"""

from __future__ import annotations

import os

try:
    import torch

    _HAS_CUDA = bool(torch.cuda.is_available())
except ImportError:  # the tests then fail one by one with "No module named 'torch'"
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
