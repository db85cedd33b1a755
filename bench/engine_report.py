"""The engine benchmark's report: the environment line, one section of tables per model,
and the markdown file with its JSON twin.

Past the environment line it reads only the dicts the stages return (``engine_systems``), so
a table's layout changes here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

from engine_systems import LABELS, SYSTEMS


def environment(threads: int) -> dict[str, str]:
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": str(os.cpu_count()),
        "torch threads (CPU)": str(threads),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
        env["cuda"] = str(torch.version.cuda)
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = "not installed"
    else:
        env["device"] = "CPU"
    return env


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value * scale:,.{digits}f}"


def mib(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:,.0f}" if value >= 100 * 2**20 else f"{value / 2**20:,.2f}"


def model_section(
    name: str, prep: dict[str, Any], results: dict[str, dict[str, Any]], args: argparse.Namespace
) -> list[str]:
    lines = [f"### {name}", ""]
    if "error" in prep:
        return [
            *lines,
            f"model preparation failed: {prep['error']}",
            "",
            "```",
            prep.get("log", ""),
            "```",
            "",
        ]
    lines.append(f"{prep['source']}, {prep['params'] / 1e6:,.0f} M parameters.")
    lines.append("")
    mini = results.get("mini", {})
    mini_tps = mini.get("offline", {}).get("tok_per_s") if "error" not in mini else None
    lines += [
        "| system | output tok/s | mini-vLLM is | TTFT p50 (s) | TTFT p99 (s) | "
        "TPOT p50 (ms) | TPOT p99 (ms) | KV held at peak (MiB) | peak memory beyond "
        "weights (MiB) | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for system in SYSTEMS:
        if system not in results:
            continue
        r = results[system]
        label = LABELS[system]
        if "error" in r or "skipped" in r:
            why = r.get("skipped") or r.get("error")
            lines.append(f"| {label} | n/a | | | | | | | | {why} |")
            continue
        row = r["offline"] if system == "mini" else r
        tps = row["tok_per_s"]
        ratio = (
            "1.00x"
            if system == "mini"
            else (f"{mini_tps / tps:.2f}x" if mini_tps and tps else "n/a")
        )
        notes = []
        if system == "mini":
            notes.append(
                f"{r['num_gpu_blocks']:,} blocks allocated ({mib(r['kv_allocated_bytes'])} MiB)"
            )
            notes.append("CUDA graphs" if r.get("cuda_graphs") else "eager")
            if r.get("tensor_parallel_size", 1) > 1:
                notes.append(f"TP={r['tensor_parallel_size']} (KV figures per rank)")
            if row.get("partial"):
                notes.append(
                    f"stopped at the time limit: {row['finished']} of {row['requests']} requests"
                )
        if system == "hf-static":
            notes.append(f"batches of {r['batch_size']}")
            if r.get("estimated"):
                notes.append(
                    f"time limit reached after {r['stopped_at']}; tok/s estimated (an upper bound)"
                )
        if system == "hf-cb":
            notes.append(f"attention {r.get('attn')}")
            if r.get("estimated"):
                notes.append(
                    f"{r['finished']} of {r['requests']} finished in the time limit "
                    "(latencies of those only); " + (r.get("note") or "")
                )
        lines.append(
            f"| {label} | {fmt(tps, digits=0)} | {ratio} | {fmt(row.get('ttft_p50'), digits=2)} "
            f"| {fmt(row.get('ttft_p99'), digits=2)} | {fmt(row.get('tpot_p50'), 1e3)} | "
            f"{fmt(row.get('tpot_p99'), 1e3)} | {mib(r.get('kv_peak_bytes'))} | "
            f"{mib(r.get('mem_beyond_weights'))} | {'; '.join(notes)} |"
        )
    lines.append("")
    if "offline" in mini:
        p = mini.get("poisson")
        if p:
            lines += [
                "mini-vLLM under Poisson arrivals:",
                "",
                "| requests | rate (req/s) | output tok/s | TTFT p50 (s) | TTFT p99 (s) | "
                "TPOT p50 (ms) | TPOT p99 (ms) |",
                "|---:|---:|---:|---:|---:|---:|---:|",
                f"| {p['finished']} of {p['requests']} | {p['rate']:.2f} | "
                f"{fmt(p['tok_per_s'], digits=0)} | {fmt(p['ttft_p50'], digits=2)} | "
                f"{fmt(p['ttft_p99'], digits=2)} | {fmt(p['tpot_p50'], 1e3)} | "
                f"{fmt(p['tpot_p99'], 1e3)} |",
                "",
            ]
        d = mini.get("decode")
        if d:
            lines += ["mini-vLLM decode step at its largest decode batch:", ""]
            if "floor_s" in d:
                lines += [
                    "| batch | steps | mean context | model step (ms) | whole engine step (ms) "
                    "| weights (MiB) | KV read (MiB) | copy rate (GB/s) | floor (ms) | "
                    "model step / floor |",
                    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                    f"| {d['batch']} | {d['steps']} | {d['mean_context']:.0f} | "
                    f"{d['step_s'] * 1e3:.2f} | {d['engine_step_s'] * 1e3:.2f} | "
                    f"{mib(d['weight_bytes'])} | "
                    f"{mib(d['kv_read_bytes'])} | {d['copy_rate'] / 1e9:,.0f} | "
                    f"{d['floor_s'] * 1e3:.2f} | {d['ratio']:.2f}x |",
                    "",
                    "Model step: from the step's launch (`launch_step`) until its tokens are "
                    "sampled on the GPU (CUDA events); with async scheduling the step is queued "
                    "behind the one still running, so it counts from that one's end. "
                    "Whole engine step: launch to launch on the host, everything included. "
                    "Floor: (weights + KV read) / copy rate.",
                    "",
                ]
            else:
                lines += [
                    f"batch {d['batch']} ({d['steps']} steps, mean context "
                    f"{d['mean_context']:.0f}): {d['step_s'] * 1e3:.1f} ms a model step, "
                    f"{d['engine_step_s'] * 1e3:.1f} ms a whole engine step (no bandwidth "
                    "floor on CPU).",
                    "",
                ]
        st = mini.get("steps")
        if st and st["total"]:
            lines += [
                f"mini-vLLM spent {st['model_s']:.1f} s in {st['total']} model steps, "
                f"{st['mixed_s']:.1f} s of it in the {st['total'] - st['decode_only']} "
                "steps that held a prefill.",
                "",
            ]
    for system, r in results.items():
        if "error" in r and r.get("log"):
            lines += [
                f"<details><summary>{LABELS.get(system, system)}: {r['error']}</summary>",
                "",
                "```",
                r["log"].strip()[-1200:],
                "```",
                "",
                "</details>",
                "",
            ]
    return lines


def write_report(
    path: Path | None, header: list[str], sections: list[list[str]], data: dict[str, Any]
) -> None:
    text = "\n".join([*header, *[line for s in sections for line in s]]) + "\n"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
