"""lab-11, part 4: ``check_tensor_parallel_size`` accepts the sizes a model can be split by and
returns each rank's shapes, and refuses the others with a message that says which dimension
does not split and by what (the numbers are checked, not the wording)."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

from grading.suite import graded
from mini_vllm.distributed import sharding as ref
from tests.labs.common import same_data
from tests.labs.lab_11.support import KV_HEADS, numbers, show, side, value


def model(heads: int, kv: int, intermediate: int, vocab: int) -> dict[str, int]:
    return dict(
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=intermediate,
        vocab_size=vocab,
    )


SMOLLM2 = model(9, 3, 1536, 49152)
LLAMA3_8B = model(32, 8, 14336, 128256)
TINY = model(4, 2, 64, 100)  # fewer KV heads than 4 ranks: replicated
GPT2 = model(12, 12, 3072, 50257)  # an odd vocabulary: only its padded size (50,304) divides
# Multi-head attention as older configs state it: no num_key_value_heads, or None.
GPT2_NO_KV = {k: v for k, v in GPT2.items() if k != "num_key_value_heads"}
GPT2_KV_NONE = {**GPT2, "num_key_value_heads": None}


EVERY_SIZE = " (a check that refuses every size refuses the right ones too)"
# Any of these names the MLP width in a refusal (the wording is the learner's).
MLP_WORDS = ("mlp", "intermediate", "ffn", "feed", "width")


def assert_accepted(fields: dict[str, Any], tp: int, name: str, why: str = "") -> None:
    """``check_tensor_parallel_size`` accepts ``tp`` for this model, with the reference's shapes."""
    want = asdict(ref.check_tensor_parallel_size(SimpleNamespace(**fields), tp))
    got = value(side().check_tp(fields, tp), f"check_tensor_parallel_size({name}, {tp}){why}")
    assert same_data(got, want), (
        f"{name} at TP={tp}: the shapes should be {want} (plain ints), got {got}{why}"
    )


def refusal(fields: dict[str, Any], tp: Any, name: str) -> str:
    outcome = side().check_tp(fields, tp)
    assert outcome[0] == "error" and outcome[1] == "ValueError", (
        f"check_tensor_parallel_size({name}, {tp!r}) must raise ValueError, got {show(outcome)}"
    )
    return str(outcome[2])


@graded(
    3,
    "check_tensor_parallel_size returns each rank's TPShapes: heads / tp query heads, "
    "max(1, kv // tp) KV heads, the replicas, the MLP width / tp, the padded vocabulary "
    "(the PADDED vocabulary is what must divide by tp, not the real one)",
    KV_HEADS,
)
def test_accepted_sizes_give_each_ranks_shapes():
    """SmolLM2 at TP 1 and 3 (its MLP width 1536 does not split 9 ways); Llama-3-8B at 1, 2,
    8, 16; a tiny model at 2 and 4; GPT-2's shape at 2 and 4 (its 50,257 tokens do not divide
    by 2, their padded 50,304 do), also as older configs state multi-head attention: no
    num_key_value_heads, or None."""
    for name, fields, sizes in [
        ("SmolLM2", SMOLLM2, [1, 3]),
        ("Llama-3-8B", LLAMA3_8B, [1, 2, 8, 16]),
        ("tiny (4 heads, 2 KV)", TINY, [2, 4]),
        ("GPT-2 (vocabulary 50,257, padded to 50,304)", GPT2, [2, 4]),
        ("GPT-2 without num_key_value_heads (multi-head: 12 KV heads)", GPT2_NO_KV, [4]),
        ("GPT-2 with num_key_value_heads None (multi-head: 12 KV heads)", GPT2_KV_NONE, [2]),
    ]:
        for tp in sizes:
            assert_accepted(fields, tp, name)


@graded(
    2,
    "the query heads must divide by tp, also when there are more ranks than heads (query "
    "heads are never replicated): the refusal names the head count, the size asked for and "
    "the sizes that would work",
    KV_HEADS,
)
def test_refuses_query_heads_that_do_not_split():
    """SmolLM2 (9 heads) at TP=2: the sizes that divide 9 are 1, 3 and 9. A model of 2 heads
    (1 KV head) at TP=4, whose KV head, MLP width and vocabulary all split 4 ways."""
    message = refusal(SMOLLM2, 2, "SmolLM2")
    found = numbers(message)
    assert {9, 2} <= found and "head" in message.lower(), (
        f"the refusal should name the 9 attention heads and the size 2 (the query heads are "
        f"checked first; SmolLM2's 3 KV heads do not split 2 ways either): {message!r}"
    )
    assert {1, 3} <= found, (
        f"the refusal should list the sizes that divide 9 (1, 3, 9): {message!r}"
    )
    message = refusal(model(2, 1, 64, 128), 4, "2 heads, 1 KV head")
    assert {2, 4} <= numbers(message) and "head" in message.lower(), (
        f"2 query heads at TP=4: each rank would hold half a head (query heads, unlike KV "
        f"heads, are never replicated); the refusal should name the 2 heads and the size 4: "
        f"{message!r}"
    )
    # Refusing is half of the check: the same models at a size that splits are accepted.
    assert_accepted(SMOLLM2, 3, "SmolLM2", EVERY_SIZE)
    assert_accepted(model(2, 1, 64, 128), 2, "2 heads, 1 KV head", EVERY_SIZE)


@graded(
    2,
    "the KV heads must divide by tp, or tp must be a multiple of them (each KV head "
    "replicated on the same number of ranks): the refusal names both numbers",
    KV_HEADS,
)
def test_refuses_kv_heads_that_do_not_split():
    """12 heads, 4 KV heads at TP=6 (6 ranks cannot share 4 heads evenly); 12 heads, 6 KV
    heads at TP=4."""
    for fields, tp, kv in [(model(12, 4, 96, 128), 6, 4), (model(12, 6, 96, 128), 4, 6)]:
        message = refusal(fields, tp, f"12 heads, {kv} KV heads")
        lowered = message.lower()
        assert {kv, tp} <= numbers(message) and ("kv" in lowered or "key" in lowered), (
            f"12 heads, {kv} KV heads at TP={tp}: the refusal should name the {kv} KV heads "
            f"and the size {tp}: {message!r}"
        )
    assert_accepted(model(12, 4, 96, 128), 4, "12 heads, 4 KV heads", EVERY_SIZE)
    assert_accepted(model(12, 6, 96, 128), 2, "12 heads, 6 KV heads", EVERY_SIZE)


@graded(
    2,
    "the MLP width (intermediate_size) and the padded vocabulary must divide by tp too: "
    "the refusal names the dimension",
    KV_HEADS,
)
def test_refuses_mlp_width_and_vocabulary():
    """An MLP 1000 wide at TP=16; a vocabulary of 128 (already padded) at TP=3. A word names a
    dimension only where nothing else says it: not the other dimension's refusal, nor divide's
    own refusal of the same numbers (a message the same for every dimension, "the width does
    not split", names none: tests/hostile/lab_11_a_width_in_every_division.py)."""
    mlp = refusal(model(32, 8, 1000, 128256), 16, "MLP width 1000")
    vocab = refusal(model(3, 3, 96, 128), 3, "vocabulary 128")
    generic = [
        str(got[2]) if got[0] == "error" else ""
        for got in side().outcomes("divide", [[1000, 16], [128, 3]])
    ]
    assert {1000, 16} <= numbers(mlp), (
        f"intermediate_size 1000 at TP=16: the refusal should name 1000 and 16: {mlp!r}"
    )
    elsewhere = f"{generic[0]} {vocab}".lower()
    assert any(word in mlp.lower() and word not in elsewhere for word in MLP_WORDS), (
        f"intermediate_size 1000 at TP=16: the refusal should name the dimension (the MLP "
        f"width, intermediate_size), not only its numbers: divide's own message says which "
        f"numbers, not which of the model's dimensions does not split (README, task 9 and "
        f"'What the grader checks', the check): {mlp!r}; the words that name it must not "
        f"be in divide(1000, 16)'s refusal ({generic[0]!r}) nor the vocabulary's ({vocab!r})"
    )
    assert {128, 3} <= numbers(vocab) and "vocab" in vocab.lower(), (
        f"a vocabulary of 128 at TP=3: the refusal should name the vocabulary: {vocab!r}"
    )
    assert "vocab" not in f"{generic[1]} {mlp}".lower(), (
        f"a vocabulary of 128 at TP=3: the refusal names the vocabulary, but so do "
        f"divide(128, 3)'s ({generic[1]!r}) or the MLP width's ({mlp!r}): the word must name "
        "the dimension at fault, not every one"
    )
    assert_accepted(model(32, 8, 1000, 128256), 8, "MLP width 1000", EVERY_SIZE)
    assert_accepted(model(4, 4, 96, 128), 4, "vocabulary 128", EVERY_SIZE)


@graded(
    1,
    "the checks run in the README's order (query heads, KV heads, MLP width, padded "
    "vocabulary), and a model that fails two is refused for the first: the message names it",
    KV_HEADS,
)
def test_refusals_name_the_first_failing_dimension():
    """12 heads, 4 KV heads and an MLP 1000 wide at TP=6 fail the KV heads, the MLP width and
    the vocabulary of 128; 3 heads, an MLP 100 wide and a vocabulary of 128 at TP=3 fail the
    last two."""
    message = refusal(model(12, 4, 1000, 128), 6, "12 heads, 4 KV heads, MLP width 1000")
    lowered = message.lower()
    assert ("kv" in lowered or "key" in lowered) and 1000 not in numbers(message), (
        f"12 heads, 4 KV heads, MLP width 1000 at TP=6: the KV heads are checked before the MLP "
        f"width, so the refusal names the 4 KV heads, not the width 1000: {message!r}"
    )
    message = refusal(model(3, 3, 100, 128), 3, "MLP width 100, vocabulary 128")
    assert 100 in numbers(message) and "vocab" not in message.lower(), (
        f"MLP width 100 and a vocabulary of 128 at TP=3: the MLP width is checked before the "
        f"vocabulary, so the refusal names the width 100 and not the vocabulary: {message!r}"
    )
    assert_accepted(model(12, 4, 1000, 128), 4, "12 heads, 4 KV heads, MLP 1000", EVERY_SIZE)


@graded(1, "tensor_parallel_size must be a positive int: 0, -2, 2.0 and True are refused", KV_HEADS)
def test_refuses_sizes_that_are_not_positive_ints():
    """0, -2, 2.0 and True (bool is an int in Python, but not a size)."""
    for tp in [0, -2, 2.0, True]:
        refusal(TINY, tp, "tiny")
    assert_accepted(TINY, 2, "tiny", EVERY_SIZE)
