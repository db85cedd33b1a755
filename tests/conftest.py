"""Settings shared by the repository's own tests."""

from __future__ import annotations

import os

# Without an NVIDIA driver, Triton kernels run in its interpreter; the flag must be set before
# anything imports triton, and any test module may be the first to do so.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
