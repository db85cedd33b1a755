"""Flattening a decode step: from lists every step (lab-09) against the persistent ``InputBatch``.

The host work the persistent batch removes, measured alone and side by side on the same steps:
``--batch`` requests of ``--context`` tokens each decode one token per step. Per step, each side
applies the step's diff and flattens it:

* ``from lists``: what the runner did before the persistent batch: per-request token and block
  lists, one token appended to each, a block appended every ``block_size`` steps, then lab-09's
  ``prepare_inputs`` over all of them (it reads every block id and slices every list);
* ``InputBatch``: the engine's runner now: the sampled tokens written into the rows
  (``append_sampled``), new blocks appended to the rows, ``num_computed_tokens`` set, then
  ``InputBatch.prepare_inputs`` over the rows.

Both produce the same ``ModelInputs`` (checked on the first step;
``tests/engine/test_input_batch.py`` checks it in general). Reported: the median time per step
of each, and the ratio. Host CPU only: no device, no model.

    python bench/bench_input_batch.py --batch 256 --context 600
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mini_vllm.sampling_params import SamplingParams  # noqa: E402
from mini_vllm.utils.math_utils import cdiv  # noqa: E402
from mini_vllm.worker.input_batch import InputBatch  # noqa: E402
from mini_vllm.worker.model_inputs import prepare_inputs  # noqa: E402


def run(batch: int, context: int, steps: int, block_size: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    max_model_len = context + steps + 1
    tokens = [rng.integers(0, 32000, context).tolist() for _ in range(batch)]
    blocks: list[list[int]] = []
    next_block = 1
    for _ in range(batch):
        n = cdiv(context + 1, block_size)
        blocks.append(list(range(next_block, next_block + n)))
        next_block += n
    input_batch = InputBatch(
        batch, max_model_len, cdiv(max_model_len, block_size), block_size, torch.device("cpu")
    )
    params = SamplingParams(temperature=0.0)
    for i in range(batch):
        input_batch.add_request(f"r{i}", tokens[i], params, blocks[i], context - 1)
    rows = np.array([input_batch.req_id_to_index[f"r{i}"] for i in range(batch)], np.int64)
    ones = np.ones(batch, np.int64)
    computed = [context - 1] * batch
    times: dict[str, list[float]] = {"from lists": [], "InputBatch": []}
    for step in range(steps):
        sampled = rng.integers(0, 32000, batch)
        new_blocks = {}
        for i in range(batch):
            if (computed[i] + 1) % block_size == 0:
                new_blocks[i] = [next_block]
                next_block += 1

        t0 = time.perf_counter()
        if step:
            for i, token in enumerate(sampled.tolist()):
                tokens[i].append(token)
                computed[i] += 1
            for i, ids in new_blocks.items():
                blocks[i].extend(ids)
        lists = prepare_inputs(tokens, computed, [1] * batch, blocks, block_size)
        times["from lists"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        if step:
            input_batch.append_sampled(rows, sampled.astype(np.int32))
            input_batch.num_computed_tokens_cpu[rows] += 1
            for i, ids in new_blocks.items():
                input_batch.block_table.append_row(ids, int(rows[i]))
        gathered = input_batch.prepare_inputs(rows, ones, input_batch.num_tokens[rows])
        times["InputBatch"].append(time.perf_counter() - t0)

        if step == 0:
            for name in ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens"):
                assert torch.equal(getattr(lists, name), getattr(gathered, name)), name
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--context", type=int, default=600)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args(argv)
    result = run(args.batch, args.context, args.steps, args.block_size)
    print(
        f"Decode steps of {args.batch} requests, context {args.context}, block size "
        f"{args.block_size}; {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}; median of {args.steps} steps.\n"
    )
    print("| flattening | ms per step | vs from lists |\n|---|---:|---:|")
    base = result["from lists"]
    for name, value in result.items():
        print(f"| {name} | {value * 1e3:.3f} | {value / base:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
