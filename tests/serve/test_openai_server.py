"""The server through the real ``openai`` client: completions, chat, streaming, n, stop, errors.

Greedy outputs are checked against offline ``LLM.generate`` on the same checkpoint: the server
adds processes, sockets, batching with other requests and incremental detokenization, and none
of that may change a single token.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from mini_vllm.sampling_params import SamplingParams

from .conftest import TINY_MAX_MODEL_LEN

PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.api_url, api_key="unused", max_retries=0)


def offline_text(offline_llm, prompt: str, max_tokens: int) -> tuple[str, str]:
    out = offline_llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False
    )[0].outputs[0]
    return out.text, out.finish_reason


def test_health_and_models(tiny_server, client):
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_matches_offline(client, offline_llm):
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    expected, reason = offline_text(offline_llm, PROMPT, 12)
    assert resp.choices[0].text == expected
    assert resp.choices[0].finish_reason == reason
    assert resp.usage.completion_tokens <= 12
    assert resp.usage.prompt_tokens == len(offline_llm.get_tokenizer()(PROMPT).input_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_streamed_completion_equals_non_streamed(client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    # With include_usage, one last chunk without choices carries the same usage.
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert not chunks[-1].choices and chunks[-1].usage == whole.usage


def test_chat_completion_stream_and_not(client, offline_llm):
    messages = [{"role": "user", "content": "Name three colours."}]
    resp = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    expected = offline_llm.chat(
        messages, SamplingParams(temperature=0.0, max_tokens=10), use_tqdm=False
    )[0].outputs[0]
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected.text
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert not chunks[-1].choices and chunks[-1].usage == resp.usage


def test_n2_parallel_samples_share_the_prompt(tiny_server, client):
    # Long enough for several full blocks, so the second sample can hit the first's.
    prompt = " ".join(["a long shared prompt about caching blocks"] * 6)
    before = tiny_server.metrics()
    # Sampled, not greedy: upstream refuses n > 1 greedy samples (they would be identical).
    resp = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=8,
        temperature=1.0,
        n=2,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    after = tiny_server.metrics()
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert resp.usage.completion_tokens == 2 * 8
    # The second sample finds every full block of the prompt but the one holding its last token.
    prompt_len = resp.usage.prompt_tokens
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits == (prompt_len - 1) // 16 * 16 > 0, "the second sample recomputed the prompt"


def test_n2_streaming_with_seed(client):
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, n=2, seed=123)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    again = client.completions.create(**kwargs)
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == [texts[0], texts[1]]
    assert texts[0] != texts[1]  # sample i is seeded with seed + i


def test_seed_reproduces_and_differs(client):
    def sample(seed: int) -> str:
        return (
            client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed
            )
            .choices[0]
            .text
        )

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def _stop_spanning_tokens(tokenizer, text: str, token_ids: list[int]) -> str:
    """A 4-character substring of ``text`` that straddles a token boundary, first at that spot."""
    for k in range(2, len(token_ids) - 1):
        boundary = len(tokenizer.decode(token_ids[:k], skip_special_tokens=True))
        stop = text[boundary - 2 : boundary + 2]
        if len(stop) == 4 and "\ufffd" not in stop and text.find(stop) == boundary - 2:
            return stop
    pytest.skip("no clean token boundary in this output")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_spanning_tokens(client, offline_llm, stream):
    out = offline_llm.generate(
        PROMPT, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False
    )[0].outputs[0]
    stop = _stop_spanning_tokens(offline_llm.get_tokenizer(), out.text, out.token_ids)
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**kwargs).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert text == out.text[: out.text.index(stop)]
    assert reason == "stop"


def test_prompt_longer_than_max_model_len_is_bad_request(client, tiny_server):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny", prompt="hello " * TINY_MAX_MODEL_LEN)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi " * TINY_MAX_MODEL_LEN}]
        )
    with pytest.raises(openai.BadRequestError, match="too large"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=TINY_MAX_MODEL_LEN)
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "n": 0}, "n must be"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "logprobs": 21}, "max allowed: 20"),
        ({"prompt": "hi", "logprobs": -2}, "logprobs"),
        ({"prompt": "hi", "echo": True}, "echo"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"prompt": "hi", "seed": -3}, "seed"),
        ({"prompt": "hi", "top_k": -2}, "top_k"),
        # Upstream refuses n > 1 greedy samples (SamplingParams._verify_greedy_sampling).
        ({"prompt": "hi", "n": 2, "temperature": 0}, "n must be 1 when using greedy sampling"),
        # Upstream's fields the engine lacks: refused, never silently ignored.
        ({"prompt": "hi", "min_p": 0.1}, "min_p"),
        ({"prompt": "hi", "repetition_penalty": 1.3}, "repetition_penalty"),
        ({"prompt": "hi", "logit_bias": {"42": 5.0}}, "logit_bias"),
        ({"prompt": "hi", "prompt_logprobs": 1}, "prompt_logprobs"),
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": "hi", "logprobs": -1}, "`logprobs` must be a positive value"),
        ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream=True"),
        ({"prompt": [10**9]}, "vocabulary"),
        ({"prompt": ""}, "empty"),
        ({"prompt": {"not": "a prompt"}}, "prompt"),
        ({}, "prompt"),
    ],
)
def test_invalid_parameters_are_400(tiny_server, body, needle):
    resp = httpx.post(f"{tiny_server.api_url}/completions", json={"model": "tiny", **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert needle in error["message"]


@pytest.mark.parametrize(
    "body, needle",
    [
        # Upstream reads max_completion_tokens whenever it is set, 0 included.
        ({"max_completion_tokens": 0}, "max_completion_tokens must be at least 1"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"top_p": 0.5, "min_p": 0.2}, "min_p"),
        ({"echo": True}, "echo"),
    ],
)
def test_invalid_chat_parameters_are_400(tiny_server, body, needle):
    messages = [{"role": "user", "content": "hi"}]
    resp = httpx.post(
        f"{tiny_server.api_url}/chat/completions",
        json={"model": "tiny", "messages": messages, **body},
    )
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


def test_malformed_json_and_unknown_model_are_400(tiny_server, client):
    resp = httpx.post(
        f"{tiny_server.api_url}/chat/completions",
        content=b'{"model": "tiny", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert "not valid JSON" in resp.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="does not exist") as info:
        client.completions.create(model="no-such-model", prompt="hi")
    assert info.value.status_code == 400


def test_metric_names_are_upstreams(tiny_server):
    """Every ``vllm:`` metric the server exports is defined, under that name, at the pin."""
    import re
    from pathlib import Path

    loggers = (
        Path(__file__).resolve().parents[2] / "upstream/vllm-0.22.1/vllm/v1/metrics/loggers.py"
    )
    if not loggers.is_file():
        pytest.skip("upstream/ is not unpacked (make upstream)")
    upstream = set(re.findall(r'name="(vllm:[a-z0-9_]+)"', loggers.read_text()))
    text = httpx.get(f"{tiny_server.base_url}/metrics").text
    ours = set()
    for name, kind in re.findall(r"^# TYPE (vllm:[a-z0-9_]+) (\w+)", text, flags=re.M):
        if name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, one per counter/histogram
        ours.add(name.removesuffix("_total") if kind == "counter" else name)
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    } <= ours
    assert ours <= upstream, sorted(ours - upstream)
