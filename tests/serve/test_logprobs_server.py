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


def _offline_prompt_logprobs(offline_llm, prompt_token_ids: list[int], k: int):
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k)
    prompt = {"prompt_token_ids": prompt_token_ids}
    return offline_llm.generate(prompt, params, use_tqdm=False)[0].prompt_logprobs


def _assert_prompt_logprobs_equal(served: list, offline: list) -> None:
    """The server's JSON (string keys) against offline ``Logprob`` dicts, position by position."""
    assert len(served) == len(offline)
    assert served[0] is None and offline[0] is None, "the first prompt token has no logprob"
    for got, want in zip(served[1:], offline[1:], strict=True):
        assert set(got) == {str(t) for t in want}
        for token_id, lp in want.items():
            entry = got[str(token_id)]
            assert entry["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
            assert (entry["rank"], entry["decoded_token"]) == (lp.rank, lp.decoded_token)


def test_completion_prompt_logprobs_match_offline(client, offline_llm):
    """vLLM's ``prompt_logprobs``: per prompt token but the first (None), its logprob, rank and
    text and the k best, on every choice, as offline ``LLM.generate`` reports them."""
    resp = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0.8,
        n=2,
        seed=3,
        extra_body={"prompt_logprobs": 3, "return_token_ids": True},
    )
    prompt_ids = resp.choices[0].prompt_token_ids
    offline = _offline_prompt_logprobs(offline_llm, prompt_ids, 3)
    for choice in resp.choices:
        _assert_prompt_logprobs_equal(choice.model_dump()["prompt_logprobs"], offline)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
    assert plain.choices[0].model_dump().get("prompt_logprobs") is None


def test_chat_prompt_logprobs_match_offline(client, offline_llm):
    """On chat, ``prompt_logprobs`` sits beside the choices: of the prompt the template made."""
    resp = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=3,
        temperature=0,
        extra_body={"prompt_logprobs": 1, "return_token_ids": True},
    )
    body = resp.model_dump()
    offline = _offline_prompt_logprobs(offline_llm, body["prompt_token_ids"], 1)
    _assert_prompt_logprobs_equal(body["prompt_logprobs"], offline)


def test_echo_with_logprobs_scores_the_prompt_first(client, offline_llm):
    """``echo`` with ``logprobs``: the legacy lists cover the prompt's tokens, then the new
    ones (upstream asks the engine for ``logprobs`` prompt logprobs); the first prompt token
    has no logprob (``None``, and ``None`` top entries); offsets run over the echoed text;
    streamed, the first chunk of the choice carries the prompt's entries."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=2)
    plain = client.completions.create(**kwargs).choices[0]
    echoed = client.completions.create(echo=True, **kwargs).choices[0]
    tokenizer = offline_llm.get_tokenizer()
    prompt_ids = tokenizer(PROMPT).input_ids
    offline = _offline_prompt_logprobs(offline_llm, prompt_ids, 2)
    lp, n_prompt = echoed.logprobs, len(prompt_ids)
    assert echoed.text == PROMPT + plain.text
    assert lp.tokens == [tokenizer.decode([t]) for t in prompt_ids] + plain.logprobs.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [pos[t].logprob for t, pos in zip(prompt_ids[1:], offline[1:])]
    assert lp.token_logprobs[1:n_prompt] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) <= 3 for top in lp.top_logprobs[1:n_prompt])
    assert lp.token_logprobs[n_prompt:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets
    chunks = [c for c in client.completions.create(echo=True, stream=True, **kwargs) if c.choices]
    tokens, values, streamed_offsets = [], [], []
    for chunk in chunks:
        tokens += chunk.choices[0].logprobs.tokens
        values += chunk.choices[0].logprobs.token_logprobs
        streamed_offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and streamed_offsets == lp.text_offset
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_echo_with_max_tokens_0_returns_the_prompt_alone(client, offline_llm):
    """``echo`` and ``max_tokens: 0``: the prompt's text (and with ``logprobs`` its scores)
    alone, streamed or not; without ``echo``, 0 tokens is still a 400 (upstream's rules)."""
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=0, temperature=0, echo=True)
    bare = client.completions.create(**kwargs).choices[0]
    assert bare.text == PROMPT and bare.logprobs is None
    scored = client.completions.create(logprobs=1, **kwargs).choices[0]
    tokenizer = offline_llm.get_tokenizer()
    prompt_ids = tokenizer(PROMPT).input_ids
    assert scored.text == PROMPT
    assert scored.logprobs.tokens == [tokenizer.decode([t]) for t in prompt_ids]
    offline = _offline_prompt_logprobs(offline_llm, prompt_ids, 1)
    expected = [pos[t].logprob for t, pos in zip(prompt_ids[1:], offline[1:])]
    assert scored.logprobs.token_logprobs[0] is None
    assert scored.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    chunks = [c for c in client.completions.create(stream=True, logprobs=1, **kwargs) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    assert [t for c in chunks for t in c.choices[0].logprobs.tokens] == scored.logprobs.tokens
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_too_many_logprobs_name_their_field(tiny_server, field):
    """Above ``--max-logprobs`` (20), the 400's ``param`` is the field the client sent."""
    resp = httpx.post(
        f"{tiny_server.api_url}/completions",
        json={"model": "tiny", "prompt": "hi", "max_tokens": 2, field: 21},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field
