"""Fetch vLLM v0.22.1's source distribution, verify it, unpack it into ``upstream/``.

``make upstream`` runs this file with the system Python, so it uses the standard library only.
Tests import :func:`ensure_upstream` to get the unpacked tree (the ported upstream tests, the
differential test and the citation check all read upstream's own files at the pin).

Why the sdist and not ``pip download vllm==0.22.1``? pip would try to build vLLM (CUDA
extensions) just to read its metadata, and fail on a laptop. The sdist is a plain tarball: we
read the package index's *simple* page for ``vllm``, take the link to ``vllm-0.22.1.tar.gz``
(its ``#sha256=`` fragment must match our pin too), download it, and check the file's sha256
against the pin before unpacking a single byte. The pin lives here, in ``SDIST_SHA256``, and in
``UPSTREAM_PIN.md``: a changed file on the index is an error, never a silent upgrade.

Caching: after a verified unpack we write a marker file holding the tarball's sha256 into the
unpacked tree. A later run that finds the marker with the pinned hash returns at once (no
network, no hashing), so ``make upstream`` and the tests that call :func:`ensure_upstream` cost
nothing the second time. The tarball is kept next to the tree, so a damaged tree is rebuilt
from it without downloading again.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

if __package__ in (None, ""):  # run as a script (`make upstream`): make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.upstream_symbols import SymbolIndex

VERSION = "0.22.1"
SDIST_NAME = f"vllm-{VERSION}.tar.gz"
SDIST_SHA256 = "cd34902729f3767e3dfbb391956b2986bc638a54be9893e78bda9cc55669f15c"
# The simple page (PEP 503) lists every file of the project with its sha256 in the fragment.
SIMPLE_INDEX_URL = "https://pypi.org/simple/vllm/"

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = ROOT / "upstream"
# Name of the top-level directory inside the tarball (and of the unpacked tree).
TREE_NAME = f"vllm-{VERSION}"
MARKER_NAME = ".mini-vllm-verified"

# Overrides, for CI caches and index mirrors; both optional.
ENV_BASE = "MINI_VLLM_UPSTREAM_DIR"
ENV_INDEX = "MINI_VLLM_SIMPLE_INDEX"

_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
_USER_AGENT = f"mini-vllm-fetch-upstream (urllib; Python {_PY})"
_CHUNK = 1 << 20

# What to read first, upstream, and the mini_vllm module that mirrors it. The line numbers are
# looked up in the unpacked files when printed, never written down here.
GUIDE: list[tuple[str, str, str]] = [
    ("vllm/v1/core/kv_cache_utils.py", "KVCacheBlock", "mini_vllm/core/kv_cache_utils.py"),
    ("vllm/v1/core/kv_cache_utils.py", "FreeKVCacheBlockQueue", "mini_vllm/core/kv_cache_utils.py"),
    ("vllm/v1/core/kv_cache_utils.py", "hash_block_tokens", "mini_vllm/core/kv_cache_utils.py"),
    (
        "vllm/v1/core/kv_cache_utils.py",
        "get_request_block_hasher",
        "mini_vllm/core/kv_cache_utils.py",
    ),
    ("vllm/v1/core/block_pool.py", "BlockHashToBlockMap", "mini_vllm/core/block_pool.py"),
    ("vllm/v1/core/block_pool.py", "BlockPool", "mini_vllm/core/block_pool.py"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheBlocks", "mini_vllm/core/kv_cache_manager.py"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager", "mini_vllm/core/kv_cache_manager.py"),
    (
        "vllm/v1/core/kv_cache_coordinator.py",
        "UnitaryKVCacheCoordinator",
        "mini_vllm/core/kv_cache_manager.py (folded in)",
    ),
    (
        "vllm/v1/core/single_type_kv_cache_manager.py",
        "FullAttentionManager",
        "mini_vllm/core/kv_cache_manager.py (folded in)",
    ),
    ("vllm/v1/core/sched/scheduler.py", "Scheduler", "mini_vllm/core/sched/scheduler.py"),
    ("vllm/v1/core/sched/output.py", "SchedulerOutput", "mini_vllm/core/sched/output.py"),
    (
        "vllm/v1/core/sched/request_queue.py",
        "FCFSRequestQueue",
        "mini_vllm/core/sched/request_queue.py",
    ),
    ("vllm/v1/request.py", "Request", "mini_vllm/request.py"),
    ("vllm/sampling_params.py", "SamplingParams", "mini_vllm/sampling_params.py"),
]
UPSTREAM_TESTS = [
    "tests/v1/core/test_kv_cache_utils.py",
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_scheduler.py",
]


class UpstreamError(RuntimeError):
    """The sdist could not be found, downloaded, verified or unpacked."""


def base_dir(base: Path | str | None = None) -> Path:
    """The folder holding the tarball and the unpacked tree (``upstream/`` by default)."""
    if base is not None:
        return Path(base)
    env = os.environ.get(ENV_BASE)
    return Path(env) if env else DEFAULT_BASE


def tree_dir(base: Path | str | None = None) -> Path:
    """Where the unpacked sdist lives: ``<base>/vllm-0.22.1``."""
    return base_dir(base) / TREE_NAME


def is_ready(tree: Path) -> bool:
    """True if ``tree`` was unpacked from the pinned, verified tarball (the instant path)."""
    marker = tree / MARKER_NAME
    try:
        recorded = marker.read_text(encoding="ascii").strip()
    except OSError:
        return False
    return recorded == SDIST_SHA256 and (tree / "vllm" / "v1" / "core").is_dir()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (the tarball is ~36 MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _LinkCollector(HTMLParser):
    """Collects the ``href`` of every ``<a>`` of a simple-index page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            for name, value in attrs:
                if name == "href" and value:
                    self.hrefs.append(value)


def _open(url: str, accept: str) -> urllib.request.addinfourl:
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT, "Accept": accept})
    return urllib.request.urlopen(request, timeout=60)


def find_sdist_url(index_url: str | None = None) -> str:
    """Read the simple page and return the URL of ``vllm-0.22.1.tar.gz`` (no fragment).

    The link's ``#sha256=`` fragment, when present, must equal the pin: if the index lists a
    different file under the pinned name we stop before downloading anything.

    Raises:
        UpstreamError: the page cannot be read, lists no such file, or lists another hash.
    """
    index_url = index_url or os.environ.get(ENV_INDEX) or SIMPLE_INDEX_URL
    try:
        with _open(index_url, "text/html") as response:
            charset = response.headers.get_content_charset() or "utf-8"
            page = response.read().decode(charset, errors="replace")
    except OSError as exc:
        raise UpstreamError(f"cannot read the package index page {index_url}: {exc}") from exc
    collector = _LinkCollector()
    collector.feed(page)
    for href in collector.hrefs:
        url = urllib.parse.urljoin(index_url, href)
        parsed = urllib.parse.urlsplit(url)
        if urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1]) != SDIST_NAME:
            continue
        fragment = urllib.parse.parse_qs(parsed.fragment)
        listed = fragment.get("sha256", [None])[0]
        if listed is not None and listed.lower() != SDIST_SHA256:
            raise UpstreamError(
                f"the index lists {SDIST_NAME} with sha256 {listed}, but the pin is "
                f"{SDIST_SHA256}: refusing to download a different file"
            )
        return urllib.parse.urlunsplit(parsed._replace(fragment=""))
    raise UpstreamError(f"{index_url} lists no {SDIST_NAME} ({len(collector.hrefs)} links read)")


def download(url: str, dest: Path, *, verbose: bool = False) -> None:
    """Download ``url`` to ``dest`` and check the pinned sha256 before ``dest`` appears.

    The bytes go to ``dest`` + ``.part`` and are hashed as they arrive; only a verified file is
    renamed into place, so an interrupted or tampered download never looks cached.

    Raises:
        UpstreamError: network failure or hash mismatch (the partial file is removed).
    """
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    size = 0
    try:
        with _open(url, "application/octet-stream") as response, part.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            if verbose:
                mib = f"{total / 2**20:.1f} MiB" if total else "unknown size"
                print(f"downloading {url} ({mib}) ...", file=sys.stderr)
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise UpstreamError(f"download of {url} failed: {exc}") from exc
    got = digest.hexdigest()
    if got != SDIST_SHA256:
        part.unlink(missing_ok=True)
        raise UpstreamError(
            f"{SDIST_NAME} from {url} has sha256 {got} ({size} bytes), expected {SDIST_SHA256}"
        )
    os.replace(part, dest)


def _check_member(member: tarfile.TarInfo, dest: Path) -> None:
    """Refuse members that would land outside ``dest`` (for Pythons without tar filters)."""
    target = (dest / member.name).resolve()
    if not str(target).startswith(str(dest.resolve()) + os.sep):
        raise UpstreamError(f"unsafe path in {SDIST_NAME}: {member.name!r}")
    if member.issym() or member.islnk():
        link = (target.parent / member.linkname).resolve()
        if not str(link).startswith(str(dest.resolve()) + os.sep):
            raise UpstreamError(f"unsafe link in {SDIST_NAME}: {member.name!r}")
    if member.isdev():
        raise UpstreamError(f"device file in {SDIST_NAME}: {member.name!r}")


def unpack(tarball: Path, tree: Path) -> None:
    """Unpack ``tarball`` into ``tree`` atomically and write the marker.

    Extraction goes to a temporary folder beside ``tree`` and is renamed into place, so a
    crash half-way leaves either the old tree or none, never a half tree with a marker.
    """
    parent = tree.parent
    scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=parent))
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(scratch, filter="data")
            else:  # pragma: no cover - Python without PEP 706
                members = archive.getmembers()
                for member in members:
                    _check_member(member, scratch)
                archive.extractall(scratch, members=members)
        unpacked = scratch / TREE_NAME
        if not (unpacked / "vllm" / "v1" / "core").is_dir():
            raise UpstreamError(f"{SDIST_NAME} does not contain {TREE_NAME}/vllm/v1/core")
        (unpacked / MARKER_NAME).write_text(SDIST_SHA256 + "\n", encoding="ascii")
        if tree.exists():
            shutil.rmtree(tree)
        os.replace(unpacked, tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    """Serialise concurrent fetches (``make upstream`` beside a test run) on a lock file."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking, last writer wins
        yield
        return
    with (base / ".fetch.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_upstream(
    base: Path | str | None = None,
    *,
    index_url: str | None = None,
    force: bool = False,
    verbose: bool = False,
) -> Path:
    """Return the unpacked vLLM v0.22.1 tree, downloading and verifying it if needed.

    Instant when the tree carries the marker of a verified unpack. Otherwise a tarball already
    in ``base`` is re-verified and unpacked; only a missing or mismatching tarball is
    downloaded (from the simple page's link).

    Args:
        base: Folder for the tarball and the tree; ``$MINI_VLLM_UPSTREAM_DIR`` or ``upstream/``.
        index_url: Simple page to read; ``$MINI_VLLM_SIMPLE_INDEX`` or the public index.
        force: Re-verify the tarball and re-unpack even if the tree looks ready.
        verbose: Say what is being done on stderr.

    Raises:
        UpstreamError: the sdist cannot be obtained or does not match the pin.
    """
    base_path = base_dir(base)
    tree = base_path / TREE_NAME
    if not force and is_ready(tree):
        return tree
    base_path.mkdir(parents=True, exist_ok=True)
    with _locked(base_path):
        if not force and is_ready(tree):  # another process finished while we waited
            return tree
        tarball = base_path / SDIST_NAME
        if tarball.exists() and sha256_of(tarball) != SDIST_SHA256:
            if verbose:
                print(f"{tarball} does not match the pin; downloading again", file=sys.stderr)
            tarball.unlink()
        if not tarball.exists():
            download(find_sdist_url(index_url), tarball, verbose=verbose)
        elif verbose:
            print(f"using {tarball} (sha256 verified)", file=sys.stderr)
        if verbose:
            print(f"unpacking into {tree} ...", file=sys.stderr)
        unpack(tarball, tree)
    return tree


def _display(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it, for short output."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def guide(tree: Path) -> str:
    """Where to look: key upstream definitions (``path:line``) and their mini_vllm mirrors."""
    shown = _display(tree)
    lines = [
        f"vLLM v{VERSION} source (sha256 {SDIST_SHA256[:12]}..., verified): {shown}/",
        "Read upstream beside the course (UPSTREAM_PIN.md explains the mapping):",
    ]
    rows: list[tuple[str, str, str]] = []
    for rel, symbol, mirror in GUIDE:
        where = f"{shown}/{rel}"
        definition = SymbolIndex.for_file(tree / rel).resolve(symbol)
        if definition is not None:
            where += f":{definition.line}"
        rows.append((where, symbol, mirror))
    width = max(len(r[0]) for r in rows)
    name_width = max(len(r[1]) for r in rows)
    for where, symbol, mirror in rows:
        lines.append(f"  {where:<{width}}  {symbol:<{name_width}}  -> {mirror}")
    lines.append("Upstream's own tests that run against mini_vllm (tests/upstream/selected.txt):")
    lines.extend(f"  {shown}/{rel}" for rel in UPSTREAM_TESTS)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``make upstream``: ensure the tree, then print where to look."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="folder for tarball and tree")
    parser.add_argument("--index-url", default=None, help="simple page listing vllm's files")
    parser.add_argument("--force", action="store_true", help="re-verify and re-unpack")
    parser.add_argument("--quiet", action="store_true", help="print only the tree's path")
    args = parser.parse_args(argv)
    try:
        tree = ensure_upstream(
            args.dir, index_url=args.index_url, force=args.force, verbose=not args.quiet
        )
    except UpstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(tree if args.quiet else guide(tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
