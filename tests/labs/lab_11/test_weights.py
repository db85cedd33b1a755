"""lab-11, part 5: each rank's slice of a weight. The shards are cut in the learner process from
the full tensor; the judge puts them back together and compares with the full weight."""

from __future__ import annotations

from grading.suite import graded
from tests.labs.lab_11.support import (
    KV_HEADS,
    SHARES,
    qkv_shards,
    qkv_views,
    rank_shards,
    show,
    side,
    value,
)


def torch():
    import torch as t

    return t


def full_weight(rows: int, cols: int):
    """A weight whose every entry is distinct (its flat index), so a misplaced row shows."""
    t = torch()
    return t.arange(rows * cols, dtype=t.float32).reshape(rows, cols)


def where_differs(got, want) -> str:
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
    bad = (got != want).nonzero()
    return f"first difference at {bad[0].tolist()}"


@graded(
    3,
    "shard_tensor: column-parallel weights are cut along dim 0 (output rows), "
    "row-parallel along dim 1 (input columns), a column-parallel layer's 1-D bias along "
    "dim 0 like its weight, a 3-D weight along the dim given; the ranks' shards concatenated "
    "along that dim are the full tensor",
    SHARES,
    timeout=60,  # the suite's first torch test: the judge and your process import torch here
)
def test_column_and_row_shards_concatenate_back():
    """A 24 x 36 weight over 1, 2, 3, 4 and 6 ranks, along dim 0 and along dim 1; a 2 x 12 x 8
    weight along dims 1, 2 and -1 over 4 ranks; a bias of 24 (1-D) along dim 0 over 4 ranks."""
    t = torch()
    full = full_weight(24, 36)
    for dim, kind in [(0, "column-parallel (dim 0)"), (1, "row-parallel (dim 1)")]:
        for tp in [1, 2, 3, 4, 6]:
            got = rank_shards(full, dim, tp)["shards"]
            for rank, shard in enumerate(got):
                want = full.narrow(dim, rank * full.shape[dim] // tp, full.shape[dim] // tp)
                assert tuple(shard.shape) == tuple(want.shape), (
                    f"{kind}, TP={tp}: rank {rank}'s shard of a 24 x 36 weight should be "
                    f"{tuple(want.shape)}, got {tuple(shard.shape)}"
                )
            joined = t.cat(list(got), dim=dim)
            assert t.equal(joined, full), (
                f"{kind}, TP={tp}: the shards concatenated along dim {dim} are not the full "
                f"weight ({where_differs(joined, full)})"
            )
    got = rank_shards(full, -1, 4)["shards"]
    joined = t.cat(list(got), dim=1)
    assert [tuple(s.shape) for s in got] == [(24, 9)] * 4 and t.equal(joined, full), (
        f"dim=-1 is the last dimension, as everywhere in torch: a 24 x 36 weight over 4 ranks "
        f"along dim -1 should give four 24 x 9 shards, got {[tuple(s.shape) for s in got]}"
    )
    # A stacked weight (experts x rows x columns, as a mixture of experts keeps them) is cut
    # along the dim asked, its middle or its last: not "dim 0 or else the columns".
    stacked = full_weight(2 * 12, 8).reshape(2, 12, 8)
    for dim in (1, 2, -1):
        got = rank_shards(stacked, dim, 4)["shards"]
        joined = t.cat(list(got), dim=dim)
        want = [tuple(stacked.narrow(dim, 0, stacked.shape[dim] // 4).shape)] * 4
        shapes = [tuple(s.shape) for s in got]
        assert shapes == want and t.equal(joined, stacked), (
            f"a 2 x 12 x 8 weight over 4 ranks along dim {dim} should give four {want[0]} "
            f"shards that concatenate back along dim {dim}, got {shapes}: narrow along the dim "
            f"given, whatever the tensor's number of dimensions"
        )
    bias = full_weight(24, 1)[:, 0].contiguous()
    got = side().outcomes("shard_tensor", [[bias, 0, rank, 4] for rank in range(4)])
    shards = [value(o, f"shard_tensor(bias of 24 entries, 0, {r}, 4)") for r, o in enumerate(got)]
    joined = t.cat(shards)
    assert t.equal(joined, bias), (
        f"column-parallel bias (1-D, 24 entries), TP=4: the shards concatenated are not the "
        f"full bias ({where_differs(joined, bias)})"
    )


def brief(outcome) -> str:
    """An outcome whose value may be a tensor, in a few words."""
    if outcome[0] == "ok" and hasattr(outcome[1], "shape"):
        return f"a shard of shape {tuple(outcome[1].shape)}"
    return show(outcome)


@graded(
    1,
    "shard_tensor cuts EQUAL slices (shard_range, which divides exactly and checks the "
    "rank): a dimension that tp does not divide, or a rank outside [0, tp_size), is refused "
    "with ValueError, never a short, long, dropped or wrapped-around shard",
    SHARES,
)
def test_shard_tensor_refuses_an_uneven_dimension():
    """A 10 x 6 weight along dim 0 and a 6 x 10 weight along dim 1, over 4 ranks; ranks -1 and 4
    of 4, and rank 1 of 1, for a 24 x 36 weight."""
    for dim, shape in [(0, (10, 6)), (1, (6, 10))]:
        got = side().outcomes("shard_tensor", [[full_weight(*shape), dim, r, 4] for r in range(4)])
        for rank, outcome in enumerate(got):
            assert outcome[0] == "error" and outcome[1] == "ValueError", (
                f"shard_tensor of a {shape[0]} x {shape[1]} weight along dim {dim}, rank {rank} "
                f"of 4: 10 does not divide by 4, so it must raise ValueError (every rank holds "
                f"an equal shard, or the split is refused), got {brief(outcome)}"
            )
    bad = [(-1, 4), (4, 4), (1, 1)]
    got = side().outcomes("shard_tensor", [[full_weight(24, 36), 0, r, tp] for r, tp in bad])
    for (rank, tp), outcome in zip(bad, got, strict=True):
        assert outcome[0] == "error" and outcome[1] == "ValueError", (
            f"shard_tensor of a 24 x 36 weight along dim 0, rank {rank} of {tp}: there is no "
            f"such rank (ranks are 0..{tp - 1}), so it must raise ValueError (check it with "
            f"shard_range, as narrow wraps a negative start around to the last rows, and a "
            f"shortcut for TP=1 must check the rank too), got {brief(outcome)}"
        )
    # The control: the same weight at a rank that exists is cut, not refused.
    (outcome,) = side().outcomes("shard_tensor", [[full_weight(24, 36), 0, 3, 4]])
    shard = value(outcome, "shard_tensor(24 x 36 weight, 0, 3, 4)")
    assert torch().equal(shard, full_weight(24, 36)[18:24]), (
        f"shard_tensor of a 24 x 36 weight along dim 0, rank 3 of 4, must be its rows 18..23: "
        f"got {brief(outcome)} (refuse only an uneven split or a rank outside the group)"
    )


@graded(
    1,
    "shard_tensor and shard_qkv_weight return views of the weight (narrow), not copies: a "
    "rank must not hold a second copy of what it loads",
    SHARES,
)
def test_shards_are_views():
    """Each rank's shard of a 24 x 36 weight shares the weight's storage; so do its q, k and v
    rows (8 query heads, 4 KV heads split over 2 ranks, 2 KV heads replicated over 4)."""
    for dim in (0, 1):
        got = rank_shards(full_weight(24, 36), dim, 4)
        views = got["views"]
        assert all(views), f"along dim {dim}, the shards of ranks {views} are copies, not views"
        shapes = [tuple(shard.shape) for shard in got["shards"]]
        want = [(6, 36)] * 4 if dim == 0 else [(24, 9)] * 4
        assert shapes == want, (
            f"along dim {dim}, each rank's view must be its quarter of the 24 x 36 weight, "
            f"{want[0]}: got shapes {shapes} (the whole weight shares its storage too)"
        )
    for kv, tp in [(4, 2), (2, 4)]:
        for shard_id in "qkv":
            rows = (8 if shard_id == "q" else kv) * 4
            views = qkv_views(full_weight(rows, 6), shard_id, 4, 8, kv, tp)
            copies = [rank for rank, view in enumerate(views) if not view]
            assert not copies, (
                f"shard_qkv_weight({shard_id!r}, head_dim=4, 8 heads, {kv} KV heads, TP={tp}): "
                f"the shards of ranks {copies} are copies, not views of the {shard_id}_proj "
                f"weight (cut its rows with narrow)"
            )


def qkv(shard_id: str, heads: int, kv: int, tp: int, head_dim: int = 4, bias: bool = False):
    """(full projection, every rank's shard of it) for q, k or v."""
    rows = (heads if shard_id == "q" else kv) * head_dim
    full = full_weight(rows, 1 if bias else 6)
    full = full[:, 0].contiguous() if bias else full
    got = qkv_shards(full, shard_id, head_dim, heads, kv, tp)
    return full, [
        value(o, f"shard_qkv_weight({shard_id!r}, rank {r} of {tp})") for r, o in enumerate(got)
    ]


@graded(
    3,
    "shard_qkv_weight: q by query head (shard_range over the heads), k and v by KV head "
    "(kv_head_range), head_dim rows per head; split KV heads concatenate back",
    KV_HEADS,
)
def test_qkv_split_by_head_groups():
    """8 query heads, 4 KV heads, head_dim 4, at TP 1, 2 and 4; weights and a bias."""
    t = torch()
    for tp in [1, 2, 4]:
        for shard_id in "qkv":
            for bias in (False, True):
                full, shards = qkv(shard_id, 8, 4, tp, bias=bias)
                joined = t.cat(shards, dim=0)
                what = f"{shard_id}_proj {'bias' if bias else 'weight'}"
                assert t.equal(joined, full), (
                    f"8 heads, 4 KV heads, TP={tp}: the ranks' {what} shards concatenated are "
                    f"not the full {what} ({where_differs(joined, full)}); each rank holds "
                    f"{8 // tp if shard_id == 'q' else 4 // tp} heads x 4 rows"
                )


@graded(
    3,
    "replicated KV heads: rank r's k and v rows are those of KV head r // replicas, the "
    "KV head of its query heads, NOT rows picked by the query-head range; a shard_id other "
    "than 'q', 'k' or 'v' is refused",
    KV_HEADS,
)
def test_qkv_replicated_kv_heads():
    """8 query heads, 2 KV heads, head_dim 4, at TP 4 (2 replicas) and TP 8 (4 replicas); the
    shard_ids 'o', 'kv' and '' at TP 2 and TP 1."""
    t = torch()
    for tp in [4, 8]:
        replicas = tp // 2
        for shard_id in "kv":
            full, shards = qkv(shard_id, 8, 2, tp)
            for rank, shard in enumerate(shards):
                head = rank // replicas
                want = full[head * 4 : (head + 1) * 4]
                assert t.equal(shard, want) if tuple(shard.shape) == (4, 6) else False, (
                    f"8 heads, 2 KV heads, TP={tp}: rank {rank} computes query heads "
                    f"{rank * 8 // tp}..{(rank + 1) * 8 // tp - 1}, so its {shard_id}_proj shard "
                    f"should be KV head {head}'s 4 rows (rows {head * 4}..{head * 4 + 3}); "
                    f"{where_differs(shard, want)}"
                )
    for tp in (2, 1):
        for shard_id in ("o", "kv", "", "Q"):
            got = qkv_shards(full_weight(8, 6), shard_id, 4, 8, 2, tp)
            assert got[0][0] == "error" and got[0][1] == "ValueError", (
                f"shard_qkv_weight(..., {shard_id!r}, ..., rank 0, TP={tp}) must raise "
                f"ValueError: shard_id is 'q', 'k' or 'v' exactly (mind that '' and 'kv' are "
                f'both `in "kv"`, a substring test; "Q" is not "q"; and a shortcut for TP=1 '
                f"must check it too), got {brief(got[0])}"
            )


@graded(
    1,
    "shard_qkv_weight: query heads are split by shard_range, never replicated (unlike KV "
    "heads): q of a head count tp does not divide, fewer heads than ranks included, is "
    "refused with ValueError",
    KV_HEADS,
)
def test_qkv_query_heads_are_never_replicated():
    """q_proj of 2 query heads (1 KV head) over 4 ranks, and of 6 query heads (2 KV heads) over
    4 ranks; head_dim 4."""
    for heads, kv in [(2, 1), (6, 2)]:
        got = qkv_shards(full_weight(heads * 4, 6), "q", 4, heads, kv, 4)
        for rank, outcome in enumerate(got):
            assert outcome[0] == "error" and outcome[1] == "ValueError", (
                f"shard_qkv_weight('q', head_dim=4, {heads} query heads, {kv} KV heads, rank "
                f"{rank} of 4): {heads} query heads cannot be split over 4 ranks (a query head "
                f"is never replicated, nor cut into rows), so it must raise ValueError, got "
                f"{brief(outcome)}"
            )


@graded(
    1,
    "shard_qkv_weight checks the rank as shard_range and kv_head_range do: q, k or v of a rank "
    "outside [0, tp_size) is refused with ValueError, never wrapped around to another rank's "
    "heads",
    KV_HEADS,
)
def test_qkv_refuses_a_rank_outside_the_group():
    """q, k and v (8 query heads, 4 KV heads, head_dim 4) at ranks -1 and 4 of 4, and rank 1 of
    1."""
    cases = [(shard_id, rank, tp) for shard_id in "qkv" for rank, tp in [(-1, 4), (4, 4), (1, 1)]]
    got = side().outcomes(
        "shard_qkv_weight",
        [
            [full_weight((8 if shard_id == "q" else 4) * 4, 6), shard_id, 4, 8, 4, rank, tp]
            for shard_id, rank, tp in cases
        ],
    )
    valid = side().outcomes(
        "shard_qkv_weight",
        [[full_weight((8 if i == "q" else 4) * 4, 6), i, 4, 8, 4, 1, 4] for i in "qkv"],
    )
    for shard_id, outcome in zip("qkv", valid, strict=True):
        shard = value(
            outcome, f"shard_qkv_weight({shard_id!r}, head_dim=4, 8 heads, 4 KV heads, rank 1 of 4)"
        )
        rows = 8 if shard_id == "q" else 4
        assert tuple(shard.shape) == (rows, 6), (
            f"shard_qkv_weight({shard_id!r}, head_dim=4, 8 heads, 4 KV heads, rank 1 of 4) must "
            f"be {rows} rows of 6, got {brief(outcome)} (refuse only a rank outside the group)"
        )
    for (shard_id, rank, tp), outcome in zip(cases, got, strict=True):
        assert outcome[0] == "error" and outcome[1] == "ValueError", (
            f"shard_qkv_weight({shard_id!r}, head_dim=4, 8 heads, 4 KV heads, rank {rank} of "
            f"{tp}): there is no such rank (ranks are 0..{tp - 1}), so it must raise ValueError "
            f"(take the {'query' if shard_id == 'q' else 'KV'} heads from "
            f"{'shard_range' if shard_id == 'q' else 'kv_head_range'}, which checks the rank; "
            f"narrow wraps a negative start around to the last rows), got {brief(outcome)}"
        )
