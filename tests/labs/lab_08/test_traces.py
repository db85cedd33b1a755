"""lab-08, part 4: whole simulations — two fixed traces, then random workloads on tiny pools.

The traces are those of ``python -m mini_vllm.teaching.sim`` (the README shows how to print yours):
per step, the batch (``r3:8p`` 8 tokens completing a prompt, ``r3:4c`` a non-final chunk, ``r3:1d``
a decode), the admissions (``^`` resumed, ``+8`` a prefix hit of 8 tokens), the preemptions and the
requests that finished. The workload is replayed as the simulator does, from the judge
(``helpers.simulate``): every step is checked (the token budget, ``max_num_seqs``, the block pool's
invariants, block tables covering the computed tokens, waiting requests holding no blocks) and
executed by the fake model's runner, and in the random workloads compared with the reference
scheduler run beside it; at the end, no block may be left held and every request must have
produced exactly the fake model's tokens.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from mini_vllm.teaching.sim import SimConfig, make_workload
from tests.labs.lab_08.helpers import DOC, RANDOM_SETTINGS, bounded_shrinking, simulate

# python -m mini_vllm.teaching.sim  (6 requests, 12 blocks of 4 tokens, budget 16, max_num_seqs 4;
#   the admission gate on, as by default)
DEFAULT_TRACE = [
    # batch                 admitted          preempted  finished
    ("r0:16p", "r0", "-", "-"),
    ("r0:1d r1:14p", "r1", "-", "-"),
    ("r0:1d r1:1d", "-", "-", "r0(length)"),
    ("r1:1d r2:14p r3:1c", "r2 r3", "-", "-"),
    ("r1:1d r2:1d r3:6p", "-", "-", "-"),
    ("r1:1d r2:1d r3:1d", "-", "-", "-"),
    ("r1:1d r2:1d", "-", "r3", "-"),
    ("r1:1d r2:1d", "-", "-", "-"),
    ("r1:1d r2:1d", "-", "-", "-"),
    ("r1:1d r2:1d", "-", "-", "-"),
    ("r1:1d", "-", "r2", "-"),
    ("r1:1d", "-", "-", "r1(length)"),
    ("r2:1d r3:9p", "^r2+20 ^r3", "-", "-"),
    ("r2:1d r3:1d", "-", "-", "-"),
    ("r2:1d r3:1d", "-", "-", "r2(length)"),
    ("r3:1d r4:13p", "r4", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "r3(length)"),
    ("r4:1d r5:15c", "r5", "-", "-"),
    ("r4:1d r5:5p", "-", "-", "-"),
    ("r4:1d", "-", "r5", "-"),
    ("r4:1d", "-", "-", "r4(length)"),
    ("r5:1d", "^r5+20", "-", "-"),
    ("r5:1d", "-", "-", "-"),
    ("r5:1d", "-", "-", "-"),
    ("r5:1d", "-", "-", "-"),
    ("r5:1d", "-", "-", "-"),
    ("r5:1d", "-", "-", "r5(length)"),
]

# python -m mini_vllm.teaching.sim --requests 5 --seed 3 --blocks 10 --max-num-batched-tokens 12
#   --max-num-seqs 3 --max-model-len 32 --prompt-len 3-14 --max-tokens 3-10 --shared-prefix 4
#   --vocab-size 16 --eos-token-id 5 --long-prefill-threshold 6
THRESHOLD_TRACE = [
    ("r0:6c r1:6c", "r0 r1+4", "-", "-"),
    ("r0:6c r1:3p r2:3c", "r2+4", "-", "r1(stop)"),
    ("r0:1p r2:6c", "-", "-", "-"),
    ("r0:1d r2:1p", "-", "-", "-"),
    ("r0:1d r2:1d", "-", "-", "-"),
    ("r0:1d r2:1d", "-", "-", "-"),
    ("r0:1d r2:1d", "-", "-", "r0(length)"),
    ("r2:1d r3:6c r4:5c", "r3+4 r4+4", "-", "-"),
    ("r2:1d r3:3p", "-", "r4", "-"),
    ("r2:1d r3:1d", "-", "-", "r2(length)"),
    ("r3:1d r4:3p", "^r4+8", "-", "-"),
    ("r3:1d r4:1d", "-", "-", "r4(stop)"),
    ("r3:1d", "-", "-", "r3(length)"),
]


def compare(engine, expected) -> None:
    """Step by step, the first difference with a readable message; then the outputs."""
    got = engine.rows
    for i, (want, have) in enumerate(zip(expected, got)):
        if want != have:
            raise AssertionError(
                f"step {i} differs.\n  expected: batch {want[0]!r}, admitted {want[1]!r}, "
                f"preempted {want[2]!r}, finished {want[3]!r}\n  yours:    batch {have[0]!r}, "
                f"admitted {have[1]!r}, preempted {have[2]!r}, finished {have[3]!r}\n"
                f"  steps before it: {got[max(0, i - 3) : i]}"
            )
    assert len(got) == len(expected), (
        f"the simulation took {len(got)} steps, expected {len(expected)}"
    )
    engine.check_drained()


@graded(
    4,
    "Deterministic trace (python -m mini_vllm.teaching.sim, defaults): continuous batching, "
    "chunks, preemptions of the last running request and their resumption, step by step",
    f"{DOC}#watching-the-scheduler-in-the-simulator",
)
def test_default_simulation_trace():
    """Six requests on 12 blocks: several preemptions and resumptions with prefix hits."""
    compare(simulate(SimConfig(max_steps=200), make_workload(6, seed=0)), DEFAULT_TRACE)


@graded(
    3,
    "Deterministic trace with long_prefill_token_threshold 6, a shared prefix (hits), "
    "EOS and preemption, step by step",
    f"{DOC}#watching-the-scheduler-in-the-simulator",
)
def test_threshold_simulation_trace():
    """Five requests sharing a 4-token prefix, EOS 5, at most 6 tokens per request per step."""
    config = SimConfig(
        num_gpu_blocks=10,
        block_size=4,
        max_num_batched_tokens=12,
        max_num_seqs=3,
        max_model_len=32,
        long_prefill_token_threshold=6,
        eos_token_id=5,
        vocab_size=16,
        seed=3,
        max_steps=200,
    )
    workload = make_workload(
        5, seed=3, prompt_len=(3, 14), max_tokens=(3, 10), shared_prefix_len=4, vocab_size=16
    )
    compare(simulate(config, workload), THRESHOLD_TRACE)


@st.composite
def simulations(draw):
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.integers(8, 32))
    min_blocks = -(-(max_model_len - 1) // block_size) + 1
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.sampled_from([2, 3, 4, 1]))
    budget_low = max(max_num_seqs, 2) if chunked else max_model_len
    config = SimConfig(
        num_gpu_blocks=min_blocks + draw(st.integers(0, 2)),
        block_size=block_size,
        max_num_batched_tokens=draw(st.integers(budget_low, budget_low + 16)),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3, 5])),
        enable_caching=draw(st.booleans()),
        seed=draw(st.integers(0, 3)),
        vocab_size=16,
        eos_token_id=draw(st.sampled_from([None, 3])),
        max_steps=400,
    )
    hi = draw(st.integers(1, max_model_len - 1))
    workload = make_workload(
        draw(st.integers(2, 8)),
        seed=draw(st.integers(0, 1000)),
        prompt_len=(max(1, hi // 2), hi),
        max_tokens=(1, draw(st.integers(max_model_len // 2, max_model_len))),
        arrival_gap=(0, draw(st.integers(0, 2))),
        shared_prefix_len=draw(st.integers(0, hi - 1)),
        vocab_size=16,
    )
    return config, workload


@RANDOM_SETTINGS
@given(simulations())
def _random_workloads(case) -> None:
    config, workload = case
    engine = simulate(config, workload, reference=True)
    engine.check_drained()
    arrival = [spec.request_id for spec in sorted(workload, key=lambda s: s.arrival_step)]
    assert engine.admission_order == arrival, (
        f"first admissions must follow arrival order (FCFS): arrived {arrival}, admitted "
        f"{engine.admission_order}"
    )


@graded(
    5,
    "Random workloads on tiny pools: every step agrees with the reference scheduler (the "
    "batch: continuous batching admits whatever fits; outputs, queues, blocks), every "
    "request finishes with exactly the fake model's tokens, first admissions in arrival "
    "order (FCFS), budget and max_num_seqs respected every step, no block leaked",
    f"{DOC}#watching-the-scheduler-in-the-simulator",
    timeout=30,
)
def test_random_workloads_finish_correctly():
    """Hypothesis prints the smallest failing configuration and workload: replay it in the sim."""
    with bounded_shrinking():
        _random_workloads()
