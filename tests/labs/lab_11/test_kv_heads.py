"""lab-11, part 2: KV heads per rank. Split when there are at least as many KV heads as ranks,
replicated (one per rank, ``tp / kv`` consecutive ranks sharing it) when there are fewer; every
query head's KV head must live on the query head's rank."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from mini_vllm.distributed import sharding as ref
from tests.labs.common import GRADED_SETTINGS
from tests.labs.lab_11.support import KV_HEADS, check_table, plain_ints_hint, show, side, value


def valid(kv: int, tp: int) -> bool:
    return kv % tp == 0 or tp % kv == 0


GRID = [[kv, tp] for kv in range(1, 17) for tp in range(1, 17)]


@graded(
    3,
    "num_kv_heads_per_rank: kv / tp KV heads per rank, but never fewer than one: with "
    "fewer KV heads than ranks each rank holds one (max(1, kv // tp))",
    KV_HEADS,
)
def test_kv_heads_per_rank():
    """Every valid (KV heads, ranks) pair up to 16: Llama-3-8B's 8 KV heads on 16 ranks -> 1."""
    check_table("num_kv_heads_per_rank", [c for c in GRID if valid(*c)], "KV heads per rank")


@graded(
    2,
    "num_kv_head_replicas: tp / kv ranks hold each KV head when tp >= kv (it must "
    "divide: never floor), 1 when the heads are split",
    KV_HEADS,
)
def test_kv_head_replicas():
    """Every (KV heads, ranks) pair up to 16, including tp = 6 over 4 KV heads (refused)."""
    check_table(
        "num_kv_head_replicas", [c for c in GRID if valid(*c) or c[1] > c[0]], "KV head replicas"
    )


@graded(
    4,
    "kv_head_range: split, rank r holds its even share; replicated, it holds the one "
    "KV head r // replicas. Each KV head on exactly `replicas` consecutive ranks, and "
    "each query head's KV head on the query head's rank; a rank outside [0, tp_size) is refused",
    KV_HEADS,
)
@GRADED_SETTINGS
@given(data=st.data())
def test_kv_head_ranges_keep_query_heads_with_their_kv_heads(data):
    """A random GQA shape (KV heads, group size) and a tensor-parallel size it can take."""
    kv = data.draw(st.integers(1, 8), label="total_num_kv_heads")
    group = data.draw(st.integers(1, 4), label="query heads per KV head")
    heads = kv * group
    sizes = [tp for tp in range(1, heads + 1) if heads % tp == 0 and valid(kv, tp)]
    tp = data.draw(st.sampled_from(sizes), label="tp_size")
    replicas = ref.num_kv_head_replicas(kv, tp)
    per_rank = ref.num_kv_heads_per_rank(kv, tp)
    got = side().outcomes("kv_head_range", [[kv, r, tp] for r in [*range(tp), -1, tp]])
    for rank, outcome in zip([-1, tp], got[tp:], strict=True):
        assert outcome[0] == "error" and outcome[1] == "ValueError", (
            f"kv_head_range({kv}, {rank}, {tp}): there is no rank {rank} in a group of {tp} "
            f"(ranks are 0..{tp - 1}), so it must raise ValueError (_check_rank first, as "
            f"shard_range does), never name KV heads for it; got {show(outcome)}"
        )
    ranges = [value(o, f"kv_head_range({kv}, {r}, {tp})") for r, o in enumerate(got[:tp])]
    holders: dict[int, list[int]] = {}
    for rank, rng in enumerate(ranges):
        assert isinstance(rng, list) and len(rng) == 2 and rng[1] - rng[0] == per_rank, (
            f"kv_head_range({kv}, {rank}, {tp}) is {rng}: each rank holds {per_rank} KV "
            f"head(s) of {kv} over {tp} ranks"
        )
        assert all(type(n) is int for n in rng), (
            f"kv_head_range({kv}, {rank}, {tp}) is {rng!r}: a range of heads is two plain ints"
            f"{plain_ints_hint(rng)}"
        )
        for head in range(rng[0], rng[1]):
            assert 0 <= head < kv, f"rank {rank} holds KV head {head}: there are only {kv}"
            holders.setdefault(head, []).append(rank)
        q_first, q_last = ref.shard_range(heads, rank, tp)
        for q in range(q_first, q_last):
            assert rng[0] <= q // group < rng[1], (
                f"{heads} query heads, {kv} KV heads, {tp} ranks: rank {rank} computes query "
                f"head {q}, which reads KV head {q // group}, but holds KV heads "
                f"[{rng[0]}, {rng[1]})"
            )
    for head in range(kv):
        ranks = holders.get(head, [])
        assert len(ranks) == replicas, (
            f"{kv} KV heads on {tp} ranks: KV head {head} should be held by {replicas} rank(s), "
            f"it is held by ranks {ranks}"
        )
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), (
            f"KV head {head} is held by ranks {ranks}: ranks sharing a KV head are consecutive"
        )
