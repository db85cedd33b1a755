"""Citations of upstream's native sources (``csrc/*.cu`` and friends) are checked by text.

There is no C++ parser in the course, so ``tools/check_citations.py`` checks that the cited line
(or range) holds the backticked text nearest to the citation. These tests run the rule on a fake
upstream tree; ``tests/test_citations.py`` runs the whole course against the real sdist, native
citations included.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.check_citations import check_files, extract  # noqa: E402

KERNEL = textwrap.dedent(
    """\
    // a fake kernel
    template <typename T>
    __global__ void paged_attention_v1_kernel(
        T* out) {
      dim3 grid(num_heads, num_seqs, 1);
      float qk_max = 0.f;
      qk_max = fmaxf(qk_max, 1.f);
    }
    """
)


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    tree = tmp_path / "upstream"
    (tree / "csrc" / "attention").mkdir(parents=True)
    (tree / "csrc" / "attention" / "kernels.cuh").write_text(KERNEL)
    return tree


def check(tmp_path: Path, upstream: Path, text: str):
    page = tmp_path / "page.md"
    page.write_text(text)
    return check_files([page], upstream, tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "`paged_attention_v1_kernel` (`csrc/attention/kernels.cuh:3`)",
        "the grid, `dim3 grid(num_heads, num_seqs, 1)` (`csrc/attention/kernels.cuh:5`)",
        "`dim3  grid(num_heads,num_seqs, 1)` (`csrc/attention/kernels.cuh:5`)",  # spacing aside
        "the running maximum `qk_max` (`csrc/attention/kernels.cuh:6-7`)",
        "`upstream/vllm-0.22.1/csrc/attention/kernels.cuh:3` is `paged_attention_v1_kernel`",
        "the file `csrc/attention/kernels.cuh` alone",
    ],
)
def test_native_citation_ok(tmp_path: Path, upstream: Path, text: str) -> None:
    (result,) = check(tmp_path, upstream, text + "\n")
    assert result.ok, result.message


@pytest.mark.parametrize(
    ("text", "status", "hint"),
    [
        ("`paged_attention_v1_kernel` (`csrc/attention/kernels.cuh:4`)", "wrong-line", ":3"),
        ("`dim3 grid(num_heads, num_seqs, 2)` (`csrc/attention/kernels.cuh:5`)", "wrong-line", ""),
        ("see csrc/attention/kernels.cuh:5 for the grid", "no-symbol", "backticked"),
        ("`qk_max` (`csrc/attention/kernels.cuh:60`)", "past-eof", "lines"),
        ("`qk_max` (`csrc/attention/gone.cu:6`)", "missing-file", "no such file"),
    ],
)
def test_native_citation_wrong(
    tmp_path: Path, upstream: Path, text: str, status: str, hint: str
) -> None:
    (result,) = check(tmp_path, upstream, text + "\n")
    assert not result.ok and result.status == status, result.message
    assert hint in result.message


def test_native_paths_are_found_but_not_python_lookalikes() -> None:
    text = "`k` (`csrc/a/b.cu:3`), `csrc/a/b.h`, mini_vllm/x.cu:3 and `foo/csrc/c.cu:1`\n"
    found = [c.cited for c in extract(text, Path("page.md"))]
    assert found == ["csrc/a/b.cu:3", "csrc/a/b.h"]
