"""Time YOUR lab-04 kernels with the course's benchmark (needs a CUDA GPU).

``bench/bench_paged_decode.py`` times the reference kernel of
``mini_vllm/attention/triton_paged_attention.py``; this script runs the same benchmark, with the
same options, on the ``triton_paged_attention.py`` next to it (your file)::

    python labs/lab-04-triton-paged-attn/bench_yours.py --quick
    python labs/lab-04-triton-paged-attn/bench_yours.py --quick --no-flex   # skip FlexAttention

Every configuration first checks your output against SDPA (a ``WRONG`` mark in the table).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    sys.path.insert(0, str(ROOT))
    bench = _load("bench_paged_decode", ROOT / "bench" / "bench_paged_decode.py")
    bench.tpa = _load("triton_paged_attention", HERE / "triton_paged_attention.py")
    bench.main()


if __name__ == "__main__":
    main()
