"""Fixtures of the serving tests: a tiny checkpoint with a real tokenizer, live servers.

The server runs as ``python -m mini_vllm serve`` in a subprocess (its own session, so that the
engine core it spawns can be found and checked for orphans), on a free port, and is stopped with
SIGTERM. Most tests share one server on ``tiny_serve_dir``: a two-layer random Llama whose
vocabulary is SmolLM2's, saved next to SmolLM2's tokenizer (chat template included), so that
tokenizing, chat templates and multi-byte detokenization are real while a step costs
milliseconds. One test uses the real SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
# The KV budget and context of the tiny server: small enough to start at once, large enough
# for 32 concurrent requests without preemption.
TINY_MAX_MODEL_LEN = 256
TINY_KV_BYTES = 16 << 20
STARTUP_TIMEOUT_S = 180.0


def _smollm2_tokenizer():
    from mini_vllm.model.loader import load_tokenizer, resolve_model

    try:
        source = resolve_model(None)
    except FileNotFoundError as exc:
        pytest.skip(f"the default model is not installed: {exc}")
    return load_tokenizer(source)


@pytest.fixture(scope="session")
def tiny_serve_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama over SmolLM2's vocabulary, with SmolLM2's tokenizer."""
    path = tmp_path_factory.mktemp("tiny_serve")
    tokenizer = _smollm2_tokenizer()
    tokenizer.save_pretrained(path)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_MODEL_LEN,
        rms_norm_eps=1e-5,
        # Spread-out logits: greedy choices are decided by the model, not by float noise
        # between the batched server and the offline reference.
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def serve_tokenizer(tiny_serve_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tiny_serve_dir, local_files_only=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        if f.read().split(")")[-1].split()[0] == "Z":
            return False
    return True


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    base_url: str
    log_path: Path
    engine_pids: list[int] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples, label sets dropped (one engine, one model)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "finished_reason=" in name_labels:
                reason = name_labels.split('finished_reason="', 1)[1].split('"', 1)[0]
                name = f"{name}[{reason}]"
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def engine_stats(self) -> dict:
        """The engine core's own counters (a dev-mode route: see ``api_server.build_app``)."""
        return httpx.get(f"{self.base_url}/engine_stats", timeout=10).json()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM the server; return its exit status (killing it if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"the server ignored SIGTERM:\n{self.log()}") from None
        return self.proc.returncode


def start_server(model: Path | None, log_path: Path, *extra: str) -> ServerHandle:
    port = free_port()
    model_tag = [] if model is None else [str(model)]  # `serve MODEL`, as `vllm serve` takes it
    cmd = [sys.executable, "-m", "mini_vllm", "serve", *model_tag, "--port", str(port), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MINI_VLLM_SERVER_DEV_MODE="1")
    env.pop("VLLM_API_KEY", None)  # a key from the caller's shell would lock the tests out
    log = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    handle = ServerHandle(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited during startup:\n{handle.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{handle.base_url}/health", timeout=2).status_code == 200:
                handle.engine_pids = [
                    pid for pid in _children(proc.pid) if "spawn_main" in _cmdline(pid)
                ]
                assert len(handle.engine_pids) == 1, "expected one engine-core process"
                return handle
        time.sleep(0.25)
    handle.stop()
    raise AssertionError(f"the server was not healthy after {STARTUP_TIMEOUT_S} s:\n{handle.log()}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def tiny_args() -> list[str]:
    return [
        "--max-model-len",
        str(TINY_MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        str(TINY_KV_BYTES),
        "--served-model-name",
        "tiny",
    ]


@contextlib.contextmanager
def running_server(model: Path | None, log_path: Path, *extra: str) -> Iterator[ServerHandle]:
    handle = start_server(model, log_path, *extra)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_serve_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("server_log") / "server.log"
    # Upstream's usage.prompt_tokens_details (off by default) on, so tests can read the hits.
    extra = ("--enable-prompt-tokens-details",)
    with running_server(tiny_serve_dir, log_path, *tiny_args(), *extra) as handle:
        yield handle


@pytest.fixture(scope="session")
def offline_llm(tiny_serve_dir: Path):
    """The same checkpoint and engine settings, offline: the reference for greedy outputs."""
    from mini_vllm.llm import LLM

    torch.set_num_threads(1)
    return LLM(
        str(tiny_serve_dir),
        max_model_len=TINY_MAX_MODEL_LEN,
        kv_cache_memory_bytes=TINY_KV_BYTES,
    )
