"""Run the notebooks and export their figures and key numbers into the docs.

    python tools/export_figures.py                    # every notebook
    python tools/export_figures.py 01_fragmentation   # some of them (names or paths)

Each notebook under ``notebooks/`` is executed top to bottom with ``nbclient`` in a fresh
``python3`` kernel of this interpreter, in the ``notebooks/`` folder (as Jupyter would run it),
and is never written back: the committed notebooks carry no outputs. The notebooks themselves
decide what to export. When ``MINI_VLLM_FIGURES_DIR`` is set they save each figure there as
``<notebook>_<name>.png`` and their key numbers as ``<notebook>.numbers.json``; this tool points
that variable at a scratch folder, then moves the PNGs into ``docs/figures/`` (replacing the
notebook's old ones), merges the numbers into ``docs/figures/numbers.json`` and renders
``docs/pictures.md``, the page that shows every figure next to the numbers it produced.

``tests/test_notebooks.py`` runs the notebooks through :func:`run_notebook` too, so the docs and
the tests execute them the same way. The kernel: ``nbclient`` asks ``jupyter_client`` for the
``python3`` kernelspec, which ipykernel provides in any environment where it is installed; if an
environment lacks it, or its ``python3`` runs another interpreter, :func:`ensure_kernel` installs
this interpreter's kernelspec into the environment (``python -m ipykernel install --sys-prefix``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
FIGURES_DIR = ROOT / "docs" / "figures"
NUMBERS_FILE = FIGURES_DIR / "numbers.json"
PICTURES_MD = ROOT / "docs" / "pictures.md"
KERNEL_NAME = "python3"
# Per cell: the whole notebook must finish in 120 s, so no cell may take longer.
CELL_TIMEOUT_S = 120
# Starting a kernel imports ipykernel, which can take a while on a busy machine.
STARTUP_TIMEOUT_S = 120


def notebook_paths(names: Sequence[str] = ()) -> list[Path]:
    """The notebooks to run: all of ``notebooks/NN_*.ipynb``, or those named (stem or path)."""
    every = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return every
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            chosen.append(path.resolve())
            continue
        matches = [nb for nb in every if nb.stem == name or nb.stem.startswith(f"{name}_")]
        if not matches:
            known = ", ".join(nb.stem for nb in every)
            raise SystemExit(f"no notebook {name!r} in {NOTEBOOKS_DIR} (known: {known})")
        chosen.extend(matches)
    return chosen


def _runs_this_interpreter(argv: list[str]) -> bool:
    """Whether a kernelspec's command starts this Python (jupyter_client maps bare "python")."""
    if not argv:
        return False
    exe = argv[0]
    if exe in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info)}:
        return True
    try:
        return Path(exe).resolve() == Path(sys.executable).resolve()
    except OSError:
        return False


def ensure_kernel() -> str:
    """Return the name of a kernelspec that runs this interpreter, installing one if needed.

    A fresh virtual environment with ipykernel finds ``python3`` through ipykernel itself. A
    machine-wide or per-user ``python3`` kernelspec pointing at another Python would run the
    notebooks without this environment's packages; then (or if no spec is found at all) this
    interpreter's spec is installed into the environment and that one is used.
    """
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError as exc:  # pragma: no cover - the [notebooks] extra is missing
        raise SystemExit(
            "the notebooks need nbclient, ipykernel and matplotlib: pip install -e '.[notebooks]'"
        ) from exc
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        if _runs_this_interpreter(spec.argv):
            return KERNEL_NAME
    except NoSuchKernel:
        pass
    subprocess.run(
        [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL_NAME],
        check=True,
        capture_output=True,
    )
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    if not _runs_this_interpreter(spec.argv):
        raise SystemExit(
            f"the {KERNEL_NAME!r} kernelspec in {spec.resource_dir} runs {spec.argv[0]}, not "
            f"{sys.executable}; set JUPYTER_PREFER_ENV_PATH=1 or remove that kernelspec"
        )
    return KERNEL_NAME


def kernel_env(figures_dir: Path | None) -> dict[str, str]:
    """The kernel's environment: ours, plus the repository on ``PYTHONPATH`` (so ``mini_vllm``
    imports even when it is not installed) and the figures folder, if exporting."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")  # the real model is a local file; never reach the Hub
    env.pop("MINI_VLLM_FIGURES_DIR", None)
    if figures_dir is not None:
        env["MINI_VLLM_FIGURES_DIR"] = str(figures_dir)
    return env


def run_notebook(
    path: Path,
    workdir: Path | None = None,
    figures_dir: Path | None = None,
    timeout: int = CELL_TIMEOUT_S,
) -> tuple[Any, float]:
    """Execute the notebook at ``path``; return the executed notebook and the seconds it took.

    The notebook runs with ``workdir`` as its current folder (default: its own folder); the
    file itself is only read. A cell that raises, or runs longer than ``timeout`` seconds, raises
    ``nbclient.exceptions.CellExecutionError`` or ``CellTimeoutError``, which name the cell.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        startup_timeout=STARTUP_TIMEOUT_S,
        kernel_name=ensure_kernel(),
        resources={"metadata": {"path": str(workdir or path.parent)}},
    )
    start = time.perf_counter()
    client.execute(env=kernel_env(figures_dir))
    return nb, time.perf_counter() - start


def export(paths: Sequence[Path], out_dir: Path = FIGURES_DIR) -> dict[str, Any]:
    """Run ``paths``, move their figures into ``out_dir``, merge numbers.json, write pictures.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    numbers_file = out_dir / NUMBERS_FILE.name
    numbers: dict[str, Any] = {}
    if numbers_file.exists():
        numbers = json.loads(numbers_file.read_text())
    for path in paths:
        name = path.stem
        with tempfile.TemporaryDirectory(prefix=f"mini-vllm-{name}-") as scratch:
            print(
                f"running {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ...",
                flush=True,
            )
            _, seconds = run_notebook(path, figures_dir=Path(scratch))
            figures = sorted(Path(scratch).glob(f"{name}_*.png"))
            for old in out_dir.glob(f"{name}_*.png"):
                old.unlink()
            for png in figures:
                shutil.copyfile(png, out_dir / png.name)
            produced = Path(scratch) / f"{name}.numbers.json"
            entry = json.loads(produced.read_text()) if produced.exists() else {}
        entry["runtime_s"] = round(seconds, 1)
        entry["figures"] = [png.name for png in figures]
        numbers[name] = entry
        print(f"  {seconds:5.1f} s, {len(figures)} figures: {', '.join(p.name for p in figures)}")
    numbers = {key: numbers[key] for key in sorted(numbers)}
    numbers_file.write_text(json.dumps(numbers, indent=2) + "\n")
    if out_dir == FIGURES_DIR:
        PICTURES_MD.write_text(render_pictures(numbers))
        print(f"wrote {numbers_file.relative_to(ROOT)} and {PICTURES_MD.relative_to(ROOT)}")
    return numbers


# ------------------------------------------------------------------------------------------------
# docs/pictures.md
# ------------------------------------------------------------------------------------------------


def _nb_link(name: str) -> str:
    """A link from docs/pictures.md to the notebook (the site copies notebooks/ too)."""
    return f"[`notebooks/{name}.ipynb`](../notebooks/{name}.ipynb)"


def _img(alt: str, name: str) -> str:
    return f"![{alt}](figures/{name}.png)"


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"


def render_pictures(numbers: dict[str, Any]) -> str:
    """The page showing every exported figure with the numbers it produced."""
    parts = list(_PAGE_HEAD)
    for name, section in _SECTIONS:
        if name in numbers:
            parts.append(section(numbers[name]))
        else:
            command = f"python tools/export_figures.py {name}"
            parts.append(f"## {name}\n\nNot exported yet: `{command}`\n")
    return "\n".join(parts)


_PAGE_HEAD = [
    "# Pictures",
    "",
    "The course's central claims as plots you can regenerate. Every figure on this page is",
    "written by a notebook under `notebooks/` (`make notebooks` opens them in Jupyter), and every",
    "number next to it is the one that run produced. Regenerate both with:",
    "",
    "```bash",
    "python tools/export_figures.py       # every notebook (a few minutes on a laptop CPU)",
    "python tools/export_figures.py 02    # one of them",
    "```",
    "",
    "The tool executes each notebook, copies its PNGs into `docs/figures/`, gathers the numbers",
    "into `docs/figures/numbers.json` and rewrites this page from them; edit the page's text in",
    "`tools/export_figures.py`, not here.",
    "",
    "Each figure also appears where its idea is taught:",
    "",
    "* fragmentation and block size: phase 00,",
    "  [the contiguous allocator and its waste]"
    "(../phases/00-kv-cache/README.md#the-contiguous-allocator-and-its-waste)",
    "  and [what paging changes](../phases/00-kv-cache/README.md#what-paging-changes) (lab-02);",
    "* block tables, hit rate, eviction order: phase 02,",
    "  [blocks, block tables and the pool]"
    "(../phases/02-paged-attention/README.md#blocks-block-tables-and-the-pool),",
    "  [part 2](../phases/02-paged-attention/README.md#part-2-prefix-caching-lab-05) and",
    "  [eviction order](../phases/02-paged-attention/README.md#eviction-order) (lab-05, lab-07);",
    "* the scheduler timeline: phase 03,",
    "  [running first, then waiting]"
    "(../phases/03-prefix-caching-and-scheduling/README.md#running-first-then-waiting) (lab-08);",
    "* KV usage on the real model: phase 05,",
    "  [what it costs](../phases/05-end-to-end/README.md#what-it-costs-throughput-and-latency)"
    " (lab-09).",
    "",
]


def _fragmentation(n: dict[str, Any]) -> str:
    t = n["trace"]
    rows = [
        "| allocator | tokens / held memory | tokens / all memory under load | paper (fig. 2) "
        "| never used (of held) | holes (under load) | most running | steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in n["allocators"].items():
        rows.append(
            f"| {name} | {_pct(a['token_share'])} | {_pct(a['token_share_of_memory_under_load'])} "
            f"| {_pct(a['paper_token_share'])} | {_pct(a['internal_fragmentation'])} "
            f"| {_pct(a['external_under_load'])} | {a['max_running']} | {a['num_steps']} |"
        )
    sweep = [
        "| block size | " + " | ".join(n["block_size_sweep"]) + " |",
        "|---|" + "---|" * len(n["block_size_sweep"]),
        "| waste (held slots without a token) | "
        + " | ".join(_pct(v["waste"]) for v in n["block_size_sweep"].values())
        + " |",
        "| most requests running | "
        + " | ".join(str(v["max_running"]) for v in n["block_size_sweep"].values())
        + " |",
        "| steps to serve the trace | "
        + " | ".join(str(v["num_steps"]) for v in n["block_size_sweep"].values())
        + " |",
    ]
    p = n["paged_vs_contiguous"]
    variable = [
        a["external_under_load"] for name, a in n["allocators"].items() if "max" not in name
    ]
    variable = [x for x in variable if x > 0] or [0.0]
    holes = f"{_pct(min(variable), 0)} to {_pct(max(variable), 0)}"
    lines = [
        "## Fragmentation: contiguous versus paged",
        "",
        f"Notebook {_nb_link('01_fragmentation')}. "
        f"{t['num_requests']} chat-like requests (lognormal lengths: prompt median "
        f"{t['prompt_median']:.0f}, mean {t['prompt_mean']:.0f}; output median "
        f"{t['output_median']:.0f}, mean {t['output_mean']:.0f}; clipped at max_model_len "
        f"{t['max_model_len']}) on {t['capacity_tokens']} KV slots, replayed with "
        "`mini_vllm.teaching.fragmentation` (lab-02's reference).",
        "",
        _img("Prompt and output lengths of the trace", "01_fragmentation_lengths"),
        "",
        _img("Memory maps of four allocators on the same trace", "01_fragmentation_memory_map"),
        "",
        _img("Where held memory goes, one moment and the whole run", "01_fragmentation_breakdown"),
        "",
        *rows,
        "",
        f"Reserving `max_model_len` keeps **{_pct(p['token_share_contiguous'])}** of held memory "
        f"holding tokens (the paper: 20.4 %); paging with 16-token blocks keeps "
        f"**{_pct(p['token_share_paged'])}** (waste {_pct(p['waste_paged'])}, the paper: under "
        f"4 %), runs {p['max_running_ratio']:.1f}× as many requests at once and serves the trace "
        f'{p["throughput_ratio"]:.1f}× faster. "Under load" averages the whole memory over the '
        "steps with requests waiting, as the paper's figure counts; there the power-of-two and "
        f"oracle reservations lose {holes} of the memory to holes, yet still come out above the "
        "paper's 26.8 % and 38.2 %: the notebook's last section goes through the reservation "
        "policy, the length distribution, the block size and what the simulation leaves out.",
        "",
        _img("Waste, concurrency and time versus block size", "01_fragmentation_block_size"),
        "",
        *sweep,
        "",
    ]
    return "\n".join(lines)


def _prefix_sharing(n: dict[str, Any]) -> str:
    b, h, e = n["block_tables"], n["hit_rate_vs_prefix"], n["eviction"]
    rows = h["rows"]
    lines = [
        "## Prefix sharing: block tables, hit rate, eviction order",
        "",
        f"Notebook {_nb_link('02_prefix_sharing')}, driving "
        "`mini_vllm.core.kv_cache_manager.KVCacheManager` (lab-07's reference) with requests "
        "that carry block hashes.",
        "",
        _img("Block tables sharing a system prompt", "02_prefix_sharing_block_tables"),
        "",
        f"Four requests share a {b['system_prompt_tokens']}-token system prompt with blocks of "
        f"{b['block_size']} tokens: blocks {b['shared_block_ids']} are shared (the prompt's last "
        f"{b['system_prompt_tokens'] % b['block_size']} tokens share a block with each request's "
        "own tokens, so that block is private). "
        f"{b['blocks_in_use']} blocks in use instead of {b['blocks_without_sharing']}.",
        "",
        _img("Hit rate and memory saved versus prefix length", "02_prefix_sharing_hit_rate"),
        "",
        "| shared prefix (tokens) | " + " | ".join(str(r["prefix_len"]) for r in rows) + " |",
        "|---|" + "---|" * len(rows),
        "| prefix-cache hit rate | " + " | ".join(_pct(r["hit_rate"], 0) for r in rows) + " |",
        "| KV memory saved | " + " | ".join(_pct(r["memory_saved"], 0) for r in rows) + " |",
        "",
        f"{h['num_requests']} requests, blocks of {h['block_size']} tokens, questions of median "
        f"{h['question_median']:.0f} tokens, {h['new_tokens']} tokens decoded each.",
        "",
        _img("The free queue after the requests finish", "02_prefix_sharing_eviction_order"),
        "",
        f"After the requests finish in the order {', '.join(e['finish_order'])}, the free queue "
        f"(front first) is `{e['free_queue_after_finish']}`: never-used blocks, then each "
        "request's blocks tail first in the order they finished, and the shared system prompt "
        f"last, its first block at the very back. A new request with the same system prompt hits "
        f"{e['E_hit_tokens']} tokens and revives them from the back; an unrelated one evicts "
        f"`{e['evicted_by_F']}`, the least recently used cached blocks.",
        "",
    ]
    return "\n".join(lines)


def _scheduler(n: dict[str, Any]) -> str:
    rows = [
        "| run | steps | tokens/step | TTFT p50 / p90 / p99 | end-to-end p50 / p90 / p99 "
        "| preemptions |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in n["runs"].items():
        ttft = " / ".join(f"{v:.0f}" for v in r["ttft"].values())
        e2e = " / ".join(f"{v:.0f}" for v in r["e2e"].values())
        rows.append(
            f"| {name} | {r['steps']} | {r['tokens_per_step']:.2f} | {ttft} | {e2e} "
            f"| {r['preemptions']} |"
        )
    t = n["trace"]
    lines = [
        "## Scheduler timeline: static versus continuous batching",
        "",
        f"Notebook {_nb_link('03_scheduler_timeline')}. "
        f"{t['num_requests']} requests ({t['total_output_tokens']} output tokens, at most "
        f"{t['max_num_seqs']} at once); continuous batching is mini-vLLM's `Scheduler` driven "
        "by `mini_vllm.teaching.sim` with a fake model, static batching a replay that runs each "
        "batch until its longest request is done. Latencies in steps from arrival.",
        "",
        _img("Gantt charts of static and continuous batching", "03_scheduler_timeline_gantt"),
        "",
        _img("Latency percentiles", "03_scheduler_timeline_latency"),
        "",
        *rows,
        "",
    ]
    return "\n".join(lines)


def _kv_usage(n: dict[str, Any]) -> str:
    held = n["mean_slots_held"]
    lines = [
        "## KV usage on the real model",
        "",
        f"Notebook {_nb_link('04_kv_usage_real_model')}. {n['model']}, "
        f"{n['num_requests']} chat requests served by mini-vLLM's `LLMEngine` "
        f"(max_num_seqs {n['max_num_seqs']}, max_model_len {n['max_model_len']}) with a KV "
        f"cache of {n['num_gpu_blocks']} blocks of {n['block_size']} tokens "
        f"({n['block_kib']:.0f} KiB each).",
        "",
        _img("KV usage over time on SmolLM2-135M", "04_kv_usage_real_model_kv_usage"),
        "",
        "| | paged (the engine) | contiguous, prompt + max_tokens | contiguous, max_model_len |",
        "|---|---|---|---|",
        f"| held slots holding tokens | {_pct(n['token_share_paged'])} | "
        f"{_pct(n['token_share_contiguous_own_limit'])} | "
        f"{_pct(n['token_share_contiguous_max_model_len'])} |",
        f"| KV slots held, mean | {held['paged']:.0f} | {held['contiguous_own_limit']:.0f} | "
        f"{held['contiguous_max_model_len']:.0f} |",
        "",
        f"{n['generated_tokens']} tokens in {n['num_steps']} steps; peak usage "
        f"{_pct(n['peak_usage'], 0)} ({n['peak_blocks']} blocks), prefix-cache hit rate "
        f"{_pct(n['prefix_cache_hit_rate'], 0)} (the chat template's system prompt), "
        f"{n['num_preemptions']} preemptions; {n['tokens_per_second']:.1f} tokens/s on the CPU "
        "that ran it (a timing, not a benchmark: see `make bench`). With prompts this short "
        "(about 40 tokens) the half-empty last block weighs more than in notebook 01's "
        "long chats; paging still holds the fewest slots because it shares the system prompt "
        "and reserves nothing ahead.",
        "",
    ]
    return "\n".join(lines)


_SECTIONS = [
    ("01_fragmentation", _fragmentation),
    ("02_prefix_sharing", _prefix_sharing),
    ("03_scheduler_timeline", _scheduler),
    ("04_kv_usage_real_model", _kv_usage),
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/export_figures.py",
        description="Run the notebooks; export their figures and numbers into docs/.",
    )
    parser.add_argument("notebooks", nargs="*", help="notebook names, e.g. 01_fragmentation or 01")
    args = parser.parse_args(argv)
    paths = notebook_paths(args.notebooks)
    if not paths:
        print(f"no notebooks in {NOTEBOOKS_DIR}", file=sys.stderr)
        return 1
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    try:
        export(paths)
    except (CellExecutionError, CellTimeoutError) as exc:
        print(
            f"a notebook failed; nothing more was exported:\n{_strip_ansi(str(exc))}",
            file=sys.stderr,
        )
        return 1
    return 0


def _strip_ansi(text: str) -> str:
    """Tracebacks from the kernel come coloured for a terminal; a log wants plain text."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


if __name__ == "__main__":
    sys.exit(main())
