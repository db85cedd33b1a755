"""Turn a simulation trace into tables: ``rich`` when installed, plain text otherwise."""

from __future__ import annotations

import importlib.util
import sys
from typing import TextIO

from mini_vllm.teaching.sim.simulator import SimResult, StepRecord

_KIND_MARK = {"prefill": "p", "chunk": "c", "decode": "d"}

STEP_COLUMNS = (
    "step",
    "batch",
    "tok",
    "admitted",
    "preempted",
    "finished",
    "block tables",
    "free",
    "KV",
)
REQUEST_COLUMNS = ("request", "prompt", "output", "preempted", "finish", "matches model")


def step_row(record: StepRecord) -> tuple[str, ...]:
    """One table row per step.

    The batch reads ``r3:8p`` (8 tokens, prompt completes, a token is sampled),
    ``r3:4c`` (a non-final prompt chunk) or ``r3:1d`` (a decode). Admitted
    requests show their prefix-cache hit in tokens (``r4+8``), resumed ones are
    marked ``^``.
    """
    batch = " ".join(f"{rid}:{n}{_KIND_MARK[kind]}" for rid, n, kind in record.scheduled)
    admitted = []
    for rid, _, _ in record.scheduled:  # in admission order
        if rid not in record.admitted and rid not in record.resumed:
            continue
        mark = "^" if rid in record.resumed else ""
        hit = f"+{record.prefix_hits[rid]}" if rid in record.prefix_hits else ""
        admitted.append(f"{mark}{rid}{hit}")
    tables = " ".join(
        f"{rid}[{','.join(map(str, ids))}]" for rid, ids in record.block_tables.items()
    )
    finished = " ".join(f"{rid}({reason})" for rid, reason in record.finished)
    return (
        str(record.step),
        batch or "-",
        str(record.num_scheduled_tokens),
        " ".join(admitted) or "-",
        " ".join(record.preempted) or "-",
        finished or "-",
        tables or "-",
        str(record.num_free_blocks),
        f"{record.kv_usage:4.0%}",
    )


def request_rows(result: SimResult) -> list[tuple[str, ...]]:
    """One row per request: lengths, preemptions, finish reason, check against the model."""
    rows: list[tuple[str, ...]] = []
    bad = set(result.mismatches)
    for rid, req in result.requests.items():
        reason = result.finish_reasons.get(rid)
        rows.append(
            (
                rid,
                str(req.num_prompt_tokens),
                str(len(result.outputs.get(rid, []))),
                str(req.num_preemptions),
                str(reason) if reason is not None else "-",
                "NO" if rid in bad else "yes",
            )
        )
    return rows


def _summary(result: SimResult) -> str:
    stats = result.prefix_cache_stats
    cfg = result.config
    num_preemptions = sum(req.num_preemptions for req in result.requests.values())
    return (
        f"{len(result.requests)} requests, {result.num_steps} steps, "
        f"{num_preemptions} preemptions; prefix cache: {stats.hits}/{stats.queries} tokens hit "
        f"on first admission ({stats.hit_rate:.0%}), {stats.preempted_hits}/"
        f"{stats.preempted_queries} on resumption; pool {cfg.num_gpu_blocks} blocks x "
        f"{cfg.block_size} tokens, budget {cfg.max_num_batched_tokens} tokens, "
        f"max_num_seqs {cfg.max_num_seqs}"
    )


def _plain_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)
    ]
    lines = [title]
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def render_plain(result: SimResult) -> str:
    """The trace and the per-request summary as plain text."""
    return "\n\n".join(
        [
            _plain_table("Schedule trace", STEP_COLUMNS, [step_row(r) for r in result.steps]),
            _plain_table("Requests", REQUEST_COLUMNS, request_rows(result)),
            _summary(result),
        ]
    )


def print_result(result: SimResult, plain: bool = False, file: TextIO | None = None) -> None:
    """Print the trace with ``rich`` if it is installed (and not ``plain``)."""
    out = file if file is not None else sys.stdout
    if plain or importlib.util.find_spec("rich") is None:
        print(render_plain(result), file=out)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out)
    if not console.is_terminal:
        # Piped or captured: no terminal width to respect, so do not fold the rows.
        console.width = 200
    trace = Table(title="Schedule trace", header_style="bold")
    for column in STEP_COLUMNS:
        trace.add_column(
            column,
            justify="right" if column in ("step", "tok", "free", "KV") else "left",
            overflow="fold",
        )
    for record in result.steps:
        row = step_row(record)
        style = "red" if record.preempted else None
        trace.add_row(*row, style=style)
    console.print(trace)
    requests = Table(title="Requests", header_style="bold")
    for column in REQUEST_COLUMNS:
        requests.add_column(column)
    for row in request_rows(result):
        requests.add_row(*row, style="red" if row[-1] == "NO" else None)
    console.print(requests)
    console.print(_summary(result))
