"""The engine's block hash is the former general encoder's, and the same in every Python version.

``kv_cache_utils.sha256`` encodes one fixed layout (a block ``(parent_hash, token_ids,
extra_keys)`` or a seed string). Until issue #19 it was a general encoder of nested values,
kept unchanged in ``tests/reference/general_hash.py``; these tests prove that the switch
changed no hash:

* a property test feeds both encoders random engine-shaped inputs (token ids over the whole
  int64 range, in tuples, lists and numpy arrays; flat extra keys of strings and integers; seed
  strings; and whole requests through the request block hasher) and requires equal digests;
* the general encoder's own pinned digests still hold (the engine-shaped ones are pinned for
  the engine's encoder in ``test_kv_cache_utils.py``);
* the engine's encoder, loaded in every other Python (3.10 and later) found on this machine,
  hashes a batch of random blocks exactly as this interpreter does.

About 2 s in all, most of it the subprocesses.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.core import kv_cache_utils
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, hash_block_tokens
from tests.reference import general_hash
from tests.reference.test_kv_cache_utils import PINNED_SHA256

MODULE = Path(kv_cache_utils.__file__)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TOKEN = st.one_of(st.integers(min_value=0, max_value=256_000), INT64)
EXTRA_KEY = st.one_of(st.text(max_size=12), INT64)


@st.composite
def token_ids(draw: st.DrawFn) -> Any:
    """A block's token ids, in every container the engine or a caller may hold them in."""
    ids = draw(st.lists(TOKEN, max_size=40))
    container = draw(st.sampled_from(["tuple", "list", "numpy"]))
    if container == "numpy":
        numpy = pytest.importorskip("numpy")
        return tuple(numpy.array(ids, dtype=numpy.int64))
    return tuple(ids) if container == "tuple" else ids


BLOCKS = st.tuples(
    st.binary(max_size=40),
    token_ids(),
    st.one_of(st.none(), st.lists(EXTRA_KEY, max_size=4).map(tuple)),
)


@settings(max_examples=400, deadline=None, database=None)
@given(block=BLOCKS)
def test_blocks_hash_as_with_the_general_encoder(block: tuple[Any, Any, Any]) -> None:
    assert kv_cache_utils.sha256(block) == general_hash.sha256(block)


@settings(max_examples=100, deadline=None, database=None)
@given(seed=st.text())
def test_seeds_hash_as_with_the_general_encoder(seed: str) -> None:
    assert kv_cache_utils.sha256(seed) == general_hash.sha256(seed)


@settings(max_examples=100, deadline=None, database=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=256_000), max_size=80),
    block_size=st.integers(min_value=1, max_value=17),
    parent=st.one_of(st.none(), st.binary(min_size=32, max_size=32)),
    cache_salt=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
)
def test_requests_hash_as_with_the_general_encoder(
    tokens: list[int], block_size: int, parent: bytes | None, cache_salt: str | None
) -> None:
    """What the engine hashes, end to end: the request block hasher (salted or not) and
    hash_block_tokens."""
    request = SimpleNamespace(
        all_token_ids=tokens, num_tokens=len(tokens), block_hashes=[], cache_salt=cache_salt
    )
    engine = get_request_block_hasher(block_size, kv_cache_utils.sha256)(request)
    general = get_request_block_hasher(block_size, general_hash.sha256)(request)
    assert engine == general and len(engine) == len(tokens) // block_size
    chunk = tokens[:block_size]
    assert hash_block_tokens(kv_cache_utils.sha256, parent, chunk) == hash_block_tokens(
        general_hash.sha256, parent, chunk
    )


# Values only the general encoder takes (None as a parent, nested and mixed sequences, bool,
# bytes and ints beyond 64 bits): pinned when it was the engine's, kept to show the oracle is it.
PINNED_GENERAL_ONLY = [
    ((None, (), None), "7d76cac2f0cf7273af4fcee6ed6676206006ec80474bc29feb1407d897a99be6"),
    ((b"ab", [1, True, "x", b"y", 2**70], None),
     "8e1796b1e2d14405562e9162a32f4c440dabfba93ab89edd00116a233fe2ccb7"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "digest"), PINNED_SHA256 + PINNED_GENERAL_ONLY)
def test_the_oracle_is_the_former_encoder(value: object, digest: str) -> None:
    assert general_hash.sha256(value).hex() == digest


# --------------------------------------------------------------------------------------------
# Other Python versions
# --------------------------------------------------------------------------------------------

# Loads kv_cache_utils.py from its path (not the mini_vllm package, whose other modules need
# numpy), reads blocks as JSON on stdin and prints their digests.
CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("kv_cache_utils", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["kv_cache_utils"] = module
spec.loader.exec_module(module)
out = []
for item in json.load(sys.stdin):
    if isinstance(item, str):
        out.append(module.sha256(item).hex())
    else:
        parent, tokens, extra = item
        extra = None if extra is None else tuple(extra)
        out.append(module.sha256((bytes.fromhex(parent), tuple(tokens), extra)).hex())
print(json.dumps(out))
"""


def _other_pythons() -> dict[str, str]:
    """``{"3.12": path}`` for each working interpreter >= 3.10 other than this one's version."""
    names = [shutil.which(f"python3.{minor}") for minor in range(10, 16)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    names += sorted(glob.glob(str(pyenv / "versions" / "3.*" / "bin" / "python3")))
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    found: dict[str, str] = {}
    for exe in filter(None, names):
        try:
            probe = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = probe.stdout.strip()
        if probe.returncode != 0 or version == mine or version in found:
            continue
        if tuple(map(int, version.split("."))) >= (3, 10):
            found[version] = exe
    return found


def _random_blocks(count: int) -> list[Any]:
    rng = random.Random(19)
    items: list[Any] = ["seed-0", "", "PYTHONHASHSEED=\u00e9\u4e2d"]
    for _ in range(count):
        tokens = [rng.choice([rng.randrange(256_000), rng.randrange(-(2**63), 2**63)])
                  for _ in range(rng.randrange(0, 33))]  # fmt: skip
        extra = rng.choice(
            [None, (), (rng.randrange(-(2**63), 2**63),), ("lora-\u00e9", rng.randrange(99))]
        )
        items.append((rng.randbytes(rng.choice([0, 3, 32])), tokens, extra))
    return items


def test_block_hashes_are_the_same_in_other_python_versions() -> None:
    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no other Python (3.10 or later) on this machine")
    blocks = _random_blocks(300)
    wire = [b if isinstance(b, str) else [b[0].hex(), b[1], b[2]] for b in blocks]
    expected = [
        kv_cache_utils.sha256(b if isinstance(b, str) else (b[0], tuple(b[1]), b[2])).hex()
        for b in blocks
    ]
    for version, exe in pythons.items():
        result = subprocess.run(
            [exe, "-c", CHILD, str(MODULE)],
            input=json.dumps(wire),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"Python {version} ({exe}) failed:\n{result.stderr}"
        assert json.loads(result.stdout) == expected, f"Python {version} hashes differently"
