"""``tools/core_lines.py`` counts the engine core the one way issue #19 measures it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.core_lines import classify, count, is_core, total  # noqa: E402


def test_each_line_has_one_kind() -> None:
    source = textwrap.dedent(
        '''\
        """Module docstring,
        two lines."""

        # a comment
        def f(x):
            """One line."""
            return x  # trailing comments count as code
        '''
    )
    counts = classify(source)
    assert counts == {"docstring": 3, "blank": 1, "comment": 1, "code": 2}
    assert counts.total() == len(source.splitlines())


def test_kernels_and_teaching_code_are_not_core() -> None:
    assert is_core("mini_vllm/core/block_pool.py")
    assert is_core("mini_vllm/llm.py")
    assert not is_core("mini_vllm/attention/triton_paged_attention.py")
    assert not is_core("mini_vllm/model/triton_ops.py")
    assert not is_core("mini_vllm/teaching/fragmentation.py")
    assert not is_core("mini_vllm/core/README.md")


def test_the_working_tree_is_counted() -> None:
    counts = count(None)
    assert "mini_vllm/core" in counts and "mini_vllm/teaching" not in counts
    assert total(counts)["code"] > 1000
