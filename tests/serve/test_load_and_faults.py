"""Traffic and faults: concurrent streams with disconnects, a dead engine core, SIGTERM.

The load test is the one the phase is about: 32 clients stream at once and 8 of them hang up
mid-stream. Afterwards nothing may be left behind: no running or waiting request, no KV block
in use, and the disconnected requests must have been aborted (not generated to the end), while
every stream that completed equals the offline engine's greedy output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import openai
import pytest

from mini_vllm.sampling_params import SamplingParams

from .conftest import (
    TINY_MAX_MODEL_LEN,
    _alive,
    _children,
    _cmdline,
    running_server,
    tiny_args,
)

NUM_CLIENTS = 32
NUM_DISCONNECTING = 8
MAX_TOKENS = 24
# The disconnecting clients ask for the whole context, so a leak would show in the counters.
LONG_MAX_TOKENS = 200


def _prompts() -> list[str]:
    topics = ["rivers", "stars", "bread", "trains", "music", "chess", "rain", "glass"]
    return [f"Request {i}: tell me about {topics[i % len(topics)]} and" for i in range(NUM_CLIENTS)]


async def _stream(client: openai.AsyncOpenAI, prompt: str, disconnect: bool) -> str | None:
    stream = await client.completions.create(
        model="tiny",
        prompt=prompt,
        temperature=0,
        stream=True,
        max_tokens=LONG_MAX_TOKENS if disconnect else MAX_TOKENS,
        extra_body={"ignore_eos": True} if disconnect else None,
    )
    text = ""
    chunks = 0
    async for chunk in stream:
        text += chunk.choices[0].text
        chunks += 1
        if disconnect and chunks == 3:
            await stream.close()  # hang up mid-stream
            return None
    return text


def test_concurrent_streams_with_disconnects_leak_nothing(tiny_server, offline_llm):
    prompts = _prompts()
    disconnecting = set(range(0, NUM_CLIENTS, NUM_CLIENTS // NUM_DISCONNECTING))
    assert len(disconnecting) == NUM_DISCONNECTING
    before = tiny_server.metrics()
    core_before = tiny_server.engine_stats()

    async def run() -> list[str | None]:
        client = openai.AsyncOpenAI(
            base_url=tiny_server.api_url, api_key="unused", max_retries=0, timeout=120
        )
        try:
            return await asyncio.gather(
                *(_stream(client, p, i in disconnecting) for i, p in enumerate(prompts))
            )
        finally:
            await client.close()

    texts = asyncio.run(run())

    # Within a few steps of the last disconnect, the engine holds nothing.
    deadline = time.monotonic() + 10
    while True:
        m = tiny_server.metrics()
        idle = (
            m["vllm:num_requests_running"] == 0
            and m["vllm:num_requests_waiting"] == 0
            and m["vllm:kv_cache_usage_perc"] == 0
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert m["vllm:num_requests_running"] == 0
    assert m["vllm:num_requests_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0.0

    # In the core itself: nothing unfinished, every block back in the free queue (the null
    # block aside), and the hung-up requests were aborted, not generated to their 200 tokens.
    core = tiny_server.engine_stats()
    assert core["num_unfinished_requests"] == 0
    assert core["num_free_blocks"] == core["num_gpu_blocks"] - 1
    generated = core["num_generation_tokens"] - core_before["num_generation_tokens"]
    completed = NUM_CLIENTS - NUM_DISCONNECTING
    assert generated < completed * MAX_TOKENS + NUM_DISCONNECTING * LONG_MAX_TOKENS // 2
    finished = (m["vllm:request_success_total[length]"] + m["vllm:request_success_total[stop]"]) - (
        before["vllm:request_success_total[length]"] + before["vllm:request_success_total[stop]"]
    )
    assert finished == completed

    reference = offline_llm.generate(
        [p for i, p in enumerate(prompts) if i not in disconnecting],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        use_tqdm=False,
    )
    got = [t for i, t in enumerate(texts) if i not in disconnecting]
    assert got == [r.outputs[0].text for r in reference]
    assert all(texts[i] is None for i in disconnecting)


def test_engine_core_death_is_503(tiny_serve_dir, tmp_path):
    with running_server(tiny_serve_dir, tmp_path / "server.log", *tiny_args()) as server:
        (core_pid,) = server.engine_pids
        os.kill(core_pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            if httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503:
                break
            time.sleep(0.05)
        assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503
        resp = httpx.post(
            f"{server.api_url}/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
            timeout=10,
        )
        assert time.monotonic() - t0 < 10
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == 503
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError):  # the client's class for 5xx
            client.completions.create(model="tiny", prompt="hello", max_tokens=4)


def test_sigterm_mid_stream_shuts_down_cleanly(tiny_serve_dir, tmp_path):
    with running_server(tiny_serve_dir, tmp_path / "server.log", *tiny_args()) as server:
        (core_pid,) = server.engine_pids
        with httpx.stream(
            "POST",
            f"{server.api_url}/completions",
            json={
                "model": "tiny",
                "prompt": "hello",
                "max_tokens": TINY_MAX_MODEL_LEN - 8,
                "ignore_eos": True,
                "stream": True,
            },
            timeout=30,
        ) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            t0 = time.monotonic()
            status = server.stop()
        # uvicorn re-raises the SIGTERM it handled once its shutdown is complete (-15).
        assert status in (0, -signal.SIGTERM), server.log()
        assert "Application shutdown complete" in server.log()
        assert time.monotonic() - t0 < 20
        deadline = time.monotonic() + 5
        while _alive(core_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(core_pid), "the engine core outlived the server"


def test_tensor_parallel_server_matches_offline_and_leaves_no_worker(tiny_serve_dir, tmp_path):
    """``serve -tp 2``: the engine core starts two gloo workers; answers equal the one-rank
    engine's, and SIGTERM takes the workers down with the core."""
    from mini_vllm.llm import LLM

    prompt = "Request 0: tell me about rivers and"
    with running_server(
        tiny_serve_dir, tmp_path / "server.log", *tiny_args(), "--tensor-parallel-size", "2"
    ) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
        resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        (core_pid,) = server.engine_pids
        workers = [p for p in _children(core_pid) if "spawn_main" in _cmdline(p)]
        assert len(workers) >= 2, f"expected two TP workers under the engine core: {workers}"
        server.stop()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in [core_pid, *workers]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in [core_pid, *workers]), "a worker outlived the server"
    offline = LLM(
        str(tiny_serve_dir), max_model_len=TINY_MAX_MODEL_LEN, kv_cache_memory_bytes=16 << 20
    )
    params = SamplingParams(temperature=0, max_tokens=12)
    expected = offline.generate(prompt, params, use_tqdm=False)
    assert resp.choices[0].text == expected[0].outputs[0].text
