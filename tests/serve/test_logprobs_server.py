"""Logprobs over HTTP, in both OpenAI formats, equal to what offline ``LLM.generate`` reports.

Completions use the legacy format (parallel lists ``tokens``/``token_logprobs``/``top_logprobs``
/``text_offset``); chat uses ``logprobs.content`` with ``top_logprobs`` entries. Streaming must
deliver, chunk by chunk, exactly the entries of the whole response, text offsets continuing.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from mini_vllm.sampling_params import SamplingParams

PROMPT = "Once upon a time, in a land far"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.api_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(offline_llm):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=3)
    return offline_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]


def test_completion_logprobs_match_offline(client, offline, offline_llm):
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    tokenizer = offline_llm.get_tokenizer()
    assert lp.tokens == [tokenizer.decode([t]) for t in offline.token_ids]
    expected = [pos[t].logprob for t, pos in zip(offline.token_ids, offline.logprobs)]
    assert lp.token_logprobs == pytest.approx(expected, abs=1e-4)
    for top, position in zip(lp.top_logprobs, offline.logprobs):
        # The sampled token and the 3 best (one entry fewer when the sampled token is among them).
        assert len(top) <= 4 and len(top) == len({p.decoded_token for p in position.values()})
        best = max(position.values(), key=lambda p: p.logprob)
        assert top[best.decoded_token] == pytest.approx(best.logprob, abs=1e-4)
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets


def test_streamed_completion_logprobs_equal_the_whole(client):
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=2)
    whole = client.completions.create(**kwargs).choices[0].logprobs
    chunks = [c for c in client.completions.create(stream=True, **kwargs) if c.choices]
    tokens, values, offsets = [], [], []
    for chunk in chunks:
        lp = chunk.choices[0].logprobs
        tokens += lp.tokens
        values += lp.token_logprobs
        offsets += lp.text_offset
    assert tokens == whole.tokens
    assert values == pytest.approx(whole.token_logprobs, abs=1e-5)
    assert offsets == whole.text_offset


def test_chat_logprobs_and_top_logprobs(client, offline_llm):
    messages = [{"role": "user", "content": "Name a colour."}]
    resp = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 2
        # Greedy: the chosen token is the most likely one, listed first among the top.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    streamed = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, stream=True
    )
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [e.token for e in entries] == [e.token for e in content]
    assert all(e.top_logprobs == [] for e in entries)  # top_logprobs not asked: none listed
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"top_logprobs": 2}, "`logprobs` must be set to true"),
        ({"logprobs": True, "top_logprobs": -5}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 50}, "max allowed: 20"),
    ],
)
def test_bad_chat_logprobs_are_400(tiny_server, body, needle):
    resp = httpx.post(
        f"{tiny_server.api_url}/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body},
    )
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]
