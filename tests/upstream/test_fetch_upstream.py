"""``make upstream`` (``tools/fetch_upstream.py``), offline: a fake sdist behind a local index.

The tool's contract is about trust and caching, so that is what is tested: the pinned sha256 is
checked at the index (link fragment) and on the downloaded bytes, nothing unverified is ever
unpacked or left looking cached, and a ready tree is returned without touching the network.
Local ``file://`` URLs stand in for the package index.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from tools import fetch_upstream
from tools.fetch_upstream import (
    MARKER_NAME,
    SDIST_NAME,
    TREE_NAME,
    UpstreamError,
    ensure_upstream,
    find_sdist_url,
    is_ready,
)


def make_sdist(path: Path, text: str = "X = 1\n") -> str:
    """Write a tiny ``vllm-0.22.1.tar.gz`` with the layout the tool expects; return its sha256."""
    with tarfile.open(path, "w:gz") as archive:
        data = text.encode()
        info = tarfile.TarInfo(f"{TREE_NAME}/vllm/v1/core/block_pool.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_index(folder: Path, sdist: Path, sha: str | None) -> str:
    """A simple page listing ``sdist`` (with a ``#sha256=`` fragment unless ``sha`` is None)."""
    fragment = f"#sha256={sha}" if sha else ""
    page = folder / "index.html"
    page.write_text(
        "<html><body>\n"
        '<a href="vllm-0.1.tar.gz#sha256=00">vllm-0.1.tar.gz</a>\n'
        f'<a href="{sdist.as_uri()}{fragment}">{SDIST_NAME}</a>\n'
        "</body></html>\n"
    )
    return page.as_uri()


@pytest.fixture
def fake_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A fake sdist served by a local index, with the tool's pin pointed at it."""
    served = tmp_path / "served"
    served.mkdir()
    sdist = served / SDIST_NAME
    sha = make_sdist(sdist)
    monkeypatch.setattr(fetch_upstream, "SDIST_SHA256", sha)
    return sdist, make_index(served, sdist, sha)


def test_index_link_is_found_and_its_hash_checked(
    tmp_path: Path, fake_pin: tuple[Path, str]
) -> None:
    sdist, index = fake_pin
    assert find_sdist_url(index) == sdist.as_uri()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(UpstreamError, match="refusing to download a different file"):
        find_sdist_url(make_index(other, sdist, "ab" * 32))
    (other / "empty.html").write_text("<html></html>")
    with pytest.raises(UpstreamError, match="lists no"):
        find_sdist_url((other / "empty.html").as_uri())


def test_fetch_verify_unpack_then_instant(tmp_path: Path, fake_pin: tuple[Path, str]) -> None:
    _, index = fake_pin
    base = tmp_path / "upstream"
    tree = ensure_upstream(base, index_url=index)
    assert tree == base / TREE_NAME
    assert (tree / "vllm" / "v1" / "core" / "block_pool.py").read_text() == "X = 1\n"
    assert is_ready(tree)
    assert (base / SDIST_NAME).is_file()  # kept, so a damaged tree needs no download
    # Ready: no network at all (this index does not exist).
    assert ensure_upstream(base, index_url=(tmp_path / "nowhere.html").as_uri()) == tree


def test_damaged_tree_is_rebuilt_from_the_kept_tarball(
    tmp_path: Path, fake_pin: tuple[Path, str]
) -> None:
    _, index = fake_pin
    base = tmp_path / "upstream"
    tree = ensure_upstream(base, index_url=index)
    (tree / MARKER_NAME).unlink()
    (tree / "vllm" / "v1" / "core" / "block_pool.py").write_text("tampered\n")
    assert not is_ready(tree)
    ensure_upstream(base, index_url=(tmp_path / "nowhere.html").as_uri())
    assert (tree / "vllm" / "v1" / "core" / "block_pool.py").read_text() == "X = 1\n"


def test_a_wrong_download_is_never_kept(tmp_path: Path, fake_pin: tuple[Path, str]) -> None:
    served = tmp_path / "tampered"
    served.mkdir()
    make_sdist(served / SDIST_NAME, text="EVIL = 1\n")
    index = make_index(served, served / SDIST_NAME, sha=None)  # no fragment to catch it early
    base = tmp_path / "upstream"
    with pytest.raises(UpstreamError, match="expected"):
        ensure_upstream(base, index_url=index)
    assert not (base / SDIST_NAME).exists()
    assert not (base / (SDIST_NAME + ".part")).exists()
    assert not (base / TREE_NAME).exists()


def test_a_mismatching_cached_tarball_is_replaced(
    tmp_path: Path, fake_pin: tuple[Path, str]
) -> None:
    _, index = fake_pin
    base = tmp_path / "upstream"
    base.mkdir()
    (base / SDIST_NAME).write_bytes(b"not the pinned file")
    tree = ensure_upstream(base, index_url=index)
    assert is_ready(tree)


def test_the_pinned_sdist_is_ready() -> None:
    """The real pin: the tree every upstream test reads, verified and marked."""
    tree = ensure_upstream()
    assert is_ready(tree)
    assert (tree / MARKER_NAME).read_text().strip() == fetch_upstream.SDIST_SHA256
    assert (tree / "vllm" / "v1" / "core" / "block_pool.py").is_file()
    assert (tree / "tests" / "v1" / "core" / "test_prefix_caching.py").is_file()
