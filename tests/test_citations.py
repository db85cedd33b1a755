"""The citation check: the checker's rules on synthetic files, then the course at the pin.

Most tests build a tiny fake upstream tree in ``tmp_path`` so the rules are checked without the
sdist; the last two run the real check (``tools/check_citations.py``) against vLLM v0.22.1,
downloading the sdist on first use like every test that needs it.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.check_citations import (  # noqa: E402
    Citation,
    SymbolIndex,
    check_files,
    course_files,
    extract,
    main,
)
from tools.fetch_upstream import ensure_upstream  # noqa: E402

POOL_SOURCE = textwrap.dedent(
    '''\
    """A fake upstream module."""
    import os

    LIMIT = 3


    class Pool:
        """A pool."""

        size: int = 0

        def get(self, n):
            return n

        @property
        def free(self):
            return 0

        @free.setter
        def free(self, value):
            pass


    class Other:
        def get(self):
            return None


    def helper():
        def inner():
            pass

        return inner
    '''
)


def line_of(needle: str, source: str = POOL_SOURCE) -> int:
    """1-based line of the first line of ``source`` containing ``needle``."""
    for number, line in enumerate(source.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in source")


@pytest.fixture
def upstream_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "up"
    (tree / "vllm" / "v1" / "core").mkdir(parents=True)
    (tree / "vllm" / "v1" / "core" / "pool.py").write_text(POOL_SOURCE)
    (tree / "tests" / "v1").mkdir(parents=True)
    (tree / "tests" / "v1" / "test_pool.py").write_text("def test_pool():\n    pass\n")
    return tree


def check(text: str, tree: Path, tmp_path: Path, name: str = "notes.md") -> list[Citation]:
    doc = tmp_path / name
    doc.write_text(textwrap.dedent(text))
    return check_files([doc], tree, root=tmp_path)


def one(text: str, tree: Path, tmp_path: Path) -> Citation:
    (result,) = check(text, tree, tmp_path)
    return result


POOL = "vllm/v1/core/pool.py"


@pytest.mark.parametrize(
    "text",
    [
        "`Pool` (`{path}:{line}`) owns the blocks.",
        "`{path}:{line}` is `Pool`.",
        "see {path}:{line} for `Pool`",
        "`vllm.v1.core.pool.Pool` at `{path}:{line}`",
        "`pool.Pool` at `{path}:{line}`",
    ],
)
def test_class_citation_in_every_written_form(
    text: str, upstream_tree: Path, tmp_path: Path
) -> None:
    result = one(text.format(path=POOL, line=line_of("class Pool")), upstream_tree, tmp_path)
    assert result.ok, result.message
    assert result.symbol is not None and result.symbol.endswith("Pool")


def test_wrong_line_names_the_right_one(upstream_tree: Path, tmp_path: Path) -> None:
    right = line_of("class Pool")
    result = one(f"`Pool` (`{POOL}:{right + 1}`)\n", upstream_tree, tmp_path)
    assert not result.ok
    assert result.status == "wrong-line"
    assert result.message == (
        f"notes.md:1 cites {POOL}:{right + 1} for Pool, which is defined at :{right}"
    )


def test_methods_nested_functions_and_assignments(upstream_tree: Path, tmp_path: Path) -> None:
    text = f"""\
    `Pool.get` (`{POOL}:{line_of("def get(self, n)")}`)
    `Pool.size` (`{POOL}:{line_of("size: int")}`)
    `LIMIT` (`{POOL}:{line_of("LIMIT")}`)
    `helper.inner()` (`{POOL}:{line_of("def inner")}`)
    `Other.get` (`{POOL}:{line_of("def get(self):")}`)
    """
    results = check(text, upstream_tree, tmp_path)
    assert [r.ok for r in results] == [True] * 5, [r.message for r in results]


def test_decorated_definition_is_cited_at_its_def_line(upstream_tree: Path, tmp_path: Path) -> None:
    decorator = line_of("@property")
    result = one(f"`Pool.free` (`{POOL}:{decorator}`)", upstream_tree, tmp_path)
    assert not result.ok
    getter, setter = line_of("def free(self)"), line_of("def free(self, value)")
    assert result.message.endswith(f"which is defined at :{getter} or :{setter}")
    setter_result = one(f"`Pool.free` (`{POOL}:{setter}`)", upstream_tree, tmp_path)
    assert setter_result.ok


def test_ranges_must_lie_within_the_symbol(upstream_tree: Path, tmp_path: Path) -> None:
    first, last = line_of("@property"), line_of("return 0")
    inside = one(f"`Pool.free` (`{POOL}:{first}-{last}`)", upstream_tree, tmp_path)
    assert inside.ok, inside.message
    outside = one(f"`Pool.get` (`{POOL}:{first}-{last}`)", upstream_tree, tmp_path)
    assert outside.status == "out-of-span"
    start, end = line_of("def get(self, n)"), line_of("return n")
    assert outside.message.endswith(f"for Pool.get, which spans :{start}-{end}")


def test_unknown_names_are_skipped_for_the_nearest_defined_one(
    upstream_tree: Path, tmp_path: Path
) -> None:
    text = f"`Pool.get` (`{POOL}:{line_of('def get(self, n)')}`) returns `n`, never `None`"
    result = one(text, upstream_tree, tmp_path)
    assert result.ok and result.symbol == "Pool.get"


def test_ambiguous_and_missing_symbols(upstream_tree: Path, tmp_path: Path) -> None:
    ambiguous = one(f"`get` (`{POOL}:{line_of('def get(self, n)')}`)", upstream_tree, tmp_path)
    assert ambiguous.status == "ambiguous"
    assert "Other.get, Pool.get" in ambiguous.message
    nothing = one(f"the pool (`{POOL}:{line_of('return n')}`)", upstream_tree, tmp_path)
    assert nothing.status == "no-symbol"
    assert nothing.message.endswith(f"line {line_of('return n')} is inside Pool.get")


def test_files_lines_past_the_end_and_bare_paths(upstream_tree: Path, tmp_path: Path) -> None:
    text = """\
    `Pool` (`vllm/v1/core/nothing.py:3`)
    `Pool` (`vllm/v1/core/pool.py:999`)
    the module `vllm/v1/core/pool.py` and `vllm/v1/core/gone.py`
    but not `mini_vllm/core/pool.py:3`
    """
    results = check(text, upstream_tree, tmp_path)
    assert [r.status for r in results] == ["missing-file", "past-eof", "file", "missing-file"]


def test_shorthand_reuses_the_path_before_it(upstream_tree: Path, tmp_path: Path) -> None:
    text = (
        f"`{POOL}:{line_of('class Pool')}` is `Pool`, `:{line_of('class Other')}` `Other`, "
        f"`:{line_of('def helper')}` `helper`"
    )
    results = check(text, upstream_tree, tmp_path)
    assert [(r.symbol, r.ok) for r in results] == [
        ("Pool", True),
        ("Other", True),
        ("helper", True),
    ]


def test_wrapped_sentence_and_paragraph_breaks(upstream_tree: Path, tmp_path: Path) -> None:
    wrapped = f"""\
    The pool is `Pool`, whose getter
    (`{POOL}:{line_of("class Pool")}`) is cheap.
    """
    assert one(wrapped, upstream_tree, tmp_path).ok
    broken = f"""\
    The pool is `Pool`.

    (`{POOL}:{line_of("class Pool")}`)
    """
    assert one(broken, upstream_tree, tmp_path).status == "no-symbol"


def test_sdist_root_form_cites_upstream_tests(upstream_tree: Path, tmp_path: Path) -> None:
    result = one(
        "`test_pool` (`upstream/vllm-0.22.1/tests/v1/test_pool.py:1`)", upstream_tree, tmp_path
    )
    assert result.ok and result.path == "tests/v1/test_pool.py"


def test_python_docstrings_and_toggles(upstream_tree: Path, tmp_path: Path) -> None:
    source = f'''\
    """Mirrors ``Pool`` (``{POOL}:{line_of("class Pool")}``)."""
    # citation-check: off
    # ``Pool`` (``{POOL}:1``) is a deliberately wrong example
    # citation-check: on
    '''
    results = check(source, upstream_tree, tmp_path, name="stub.py")
    assert [(r.line_no, r.ok) for r in results] == [(1, True)]


def test_cli_lists_citations_and_fails_on_a_wrong_one(
    upstream_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.md"
    good.write_text(f"`Pool` (`{POOL}:{line_of('class Pool')}`)\n")
    bad = tmp_path / "bad.md"
    bad.write_text(f"`Pool` (`{POOL}:1`)\n")
    assert main([str(good), "--upstream", str(upstream_tree)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main([str(good), str(bad), "--upstream", str(upstream_tree)]) == 1
    out = capsys.readouterr().out
    assert "WRONG" in out and "1 wrong" in out


def test_extract_finds_every_citation_on_a_line() -> None:
    found = extract("`A` `vllm/a.py:1`, `B` `vllm/b.py:2-3` and `:4`\n", Path("x.md"))
    assert [(c.path, c.start, c.end) for c in found] == [
        ("vllm/a.py", 1, None),
        ("vllm/b.py", 2, 3),
        ("vllm/b.py", 4, None),
    ]


# --------------------------------------------------------------------------------------------
# At the pin
# --------------------------------------------------------------------------------------------


def test_design_card_lines_at_the_pin() -> None:
    """The line numbers the design card quotes, resolved in the real sdist."""
    tree = ensure_upstream()
    core = tree / "vllm" / "v1" / "core"
    expected = {
        ("kv_cache_utils.py", "KVCacheBlock"): 116,
        ("kv_cache_utils.py", "FreeKVCacheBlockQueue"): 164,
        ("kv_cache_utils.py", "hash_block_tokens"): 541,
        ("block_pool.py", "BlockPool"): 130,
        ("kv_cache_manager.py", "KVCacheManager"): 110,
    }
    for (name, symbol), line in expected.items():
        definition = SymbolIndex.for_file(core / name).resolve(symbol)
        assert definition is not None and definition.line == line, (name, symbol, definition)


def test_course_citations_point_at_the_pin() -> None:
    """Every ``vllm/...py:LINE`` in README, UPSTREAM_PIN, phases/, labs/, docs/ is right."""
    results = check_files(course_files(), ensure_upstream())
    wrong = [c.message for c in results if not c.ok]
    assert not wrong, "wrong citations (see docs/citations.md):\n" + "\n".join(wrong)
