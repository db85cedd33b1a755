"""``tools/core_lines.py`` counts the engine core the one way issue #19 measures it."""

from __future__ import annotations

import re
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


def test_the_engine_tour_counts_todays_lines():
    """Phase 01 compares upstream's scheduler and runner with ours by line count; ours move."""
    tour = (ROOT / "phases/01-engine-tour/README.md").read_text()
    stated = re.search(r"mini-vLLM's are ([\d,]+) and ([\d,]+)\.", tour)
    assert stated, "phase 01 no longer states the two line counts: update this test"
    for said, path in zip(
        stated.groups(), ["core/sched/scheduler.py", "worker/model_runner.py"], strict=True
    ):
        lines = len((ROOT / "mini_vllm" / path).read_text().splitlines())
        assert abs(int(said.replace(",", "")) - lines) <= lines // 10, (
            f"phases/01-engine-tour/README.md: mini_vllm/{path} has {lines} lines, not {said}"
        )
