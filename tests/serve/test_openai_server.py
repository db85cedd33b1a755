"""The server through the real ``openai`` client: completions, chat, streaming, n, stop, errors.

Greedy outputs are checked against offline ``LLM.generate`` on the same checkpoint: the server
adds processes, sockets, batching with other requests and incremental detokenization, and none
of that may change a single token.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from mini_vllm.sampling_params import RepetitionDetectionParams, SamplingParams

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


def test_return_token_ids(tiny_server, client, offline_llm):
    """vLLM's return_token_ids: the prompt's ids and the generated ids beside the text; streamed,
    the prompt's in each choice's first chunk and every chunk's new ids, which add up."""
    ids = {"return_token_ids": True}
    prompt_ids = offline_llm.get_tokenizer()(PROMPT).input_ids
    expected = offline_llm.generate(
        PROMPT, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False
    )[0].outputs[0]
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body=ids
    )
    choice = resp.choices[0]
    assert choice.prompt_token_ids == prompt_ids
    assert choice.token_ids == list(expected.token_ids) and choice.text == expected.text
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
    assert getattr(plain.choices[0], "token_ids", None) is None, "ids sent unasked"

    stream = client.completions.create(
        model="tiny", prompt=[PROMPT, PROMPT], max_tokens=8, temperature=0, stream=True,
        extra_body=ids,
    )  # fmt: skip
    firsts: dict[int, list[int]] = {}
    streamed: dict[int, list[int]] = {}
    for chunk in stream:
        (c,) = chunk.choices
        if c.index not in firsts:
            firsts[c.index] = c.prompt_token_ids
        else:
            assert getattr(c, "prompt_token_ids", None) is None, "prompt ids after the first chunk"
        streamed.setdefault(c.index, []).extend(c.token_ids)
    assert firsts == {0: prompt_ids, 1: prompt_ids}
    assert streamed == {0: list(expected.token_ids), 1: list(expected.token_ids)}

    messages = [{"role": "user", "content": PROMPT}]
    chat_ids = httpx.post(
        f"{tiny_server.base_url}/tokenize", json={"model": "tiny", "messages": messages}
    ).json()["tokens"]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, extra_body=ids
    )
    assert chat.prompt_token_ids == chat_ids
    text = offline_llm.get_tokenizer().decode(chat.choices[0].token_ids, skip_special_tokens=True)
    assert len(chat.choices[0].token_ids) == chat.usage.completion_tokens
    assert text == chat.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
            extra_body=ids,
        )
    )  # fmt: skip
    assert chunks[0].prompt_token_ids == chat_ids and chunks[0].choices[0].delta.role
    assert [t for c in chunks[1:] for t in c.choices[0].token_ids] == chat.choices[0].token_ids


def test_truncate_prompt_tokens(client, offline_llm):
    """Upstream's truncate_prompt_tokens: the last k prompt tokens run (the first k with
    truncation_side="right"); -1 keeps what leaves room for max_tokens, so a prompt longer
    than the model runs; more than that room is a 400."""
    prompt_ids = offline_llm.get_tokenizer()(PROMPT).input_ids
    greedy = SamplingParams(temperature=0.0, max_tokens=4)

    def offline(ids: list[int]) -> str:
        return (
            offline_llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0]
            .outputs[0]
            .text
        )

    for side, kept in ((None, prompt_ids[-5:]), ("right", prompt_ids[:5])):
        extra = {"truncate_prompt_tokens": 5, **({"truncation_side": side} if side else {})}
        resp = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, extra_body=extra
        )
        assert resp.usage.prompt_tokens == 5, side
        assert resp.choices[0].text == offline(kept), f"not the {side or 'left'} side's tokens"
    long_ids = (prompt_ids * TINY_MAX_MODEL_LEN)[: TINY_MAX_MODEL_LEN + 10]
    resp = client.completions.create(
        model="tiny", prompt=long_ids, max_tokens=4, temperature=0,
        extra_body={"truncate_prompt_tokens": -1},
    )  # fmt: skip
    assert resp.usage.prompt_tokens == TINY_MAX_MODEL_LEN - 4
    with pytest.raises(openai.BadRequestError, match="cannot be greater than max_model_len"):
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=4,
            extra_body={"truncate_prompt_tokens": TINY_MAX_MODEL_LEN},
        )  # fmt: skip
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=2,
        extra_body={"truncate_prompt_tokens": 4},
    )
    assert chat.usage.prompt_tokens == 4


def _says(token_ids: list[int], sequence: list[int]) -> bool:
    n = len(sequence)
    return any(token_ids[j : j + n] == sequence for j in range(len(token_ids) - n + 1))


def test_bad_words_are_never_generated(client, serve_tokenizer, offline_llm):
    """Upstream's bad_words: the server tokenizes each word (alone, and after a space when that
    spelling has as many tokens) and the engine core never lets the output end with one. The
    word is one the plain output says, in one of those spellings."""
    ids = {"return_token_ids": True}
    plain = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body=ids
    ).choices[0]

    def spellings(word: str) -> list[list[int]]:
        params = SamplingParams(bad_words=[word])
        params.update_from_tokenizer(serve_tokenizer, len(serve_tokenizer))
        return params.bad_words_token_ids or []

    words = (serve_tokenizer.decode([t]).strip() for t in plain.token_ids[2:])
    word = next(w for w in words if w and any(_says(plain.token_ids, seq) for seq in spellings(w)))
    banned = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
        extra_body={"bad_words": [word], **ids},
    ).choices[0]  # fmt: skip
    assert banned.token_ids != plain.token_ids, f"banning {word!r} changed nothing"
    offline = offline_llm.generate(
        PROMPT, SamplingParams(temperature=0.0, max_tokens=12, bad_words=[word]), use_tqdm=False
    )[0].outputs[0]
    assert list(offline.token_ids) == banned.token_ids, "LLM.generate banned it otherwise"
    for seq in spellings(word):
        assert not _says(banned.token_ids, seq), f"the output says the bad word {word!r}"


def test_echo_puts_the_prompt_before_the_text(client, offline_llm):
    """``echo``: each choice's text starts with its prompt's (decoded from the ids for a prompt
    of ids), streamed in the choice's first chunk; with ``return_token_ids`` the prompt comes as
    ids instead, as upstream's. With ``logprobs`` it would need the prompt's logprobs: a 400."""
    expected, _ = offline_text(offline_llm, PROMPT, 6)
    prompt_ids = offline_llm.get_tokenizer()(PROMPT).input_ids
    decoded = offline_llm.get_tokenizer().decode(prompt_ids)
    echo = {"echo": True}
    for prompt, text in ((PROMPT, PROMPT), (prompt_ids, decoded)):
        resp = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, extra_body=echo
        )
        assert resp.choices[0].text == text + expected
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, stream=True, extra_body=echo
    )
    chunks = [c.choices[0].text for c in stream if c.choices]
    assert chunks[0].startswith(PROMPT) and "".join(chunks) == PROMPT + expected
    ids = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0,
        extra_body={**echo, "return_token_ids": True},
    ).choices[0]  # fmt: skip
    assert (ids.text, ids.prompt_token_ids) == (expected, prompt_ids)


def test_repetition_detection_as_offline(client, offline_llm):
    """vLLM's repetition_detection reaches the engine core: the server stops where LLM.generate
    stops, with the same finish reason: "repetition", as this greedy continuation of the
    tiny model says one token twice after 143 tokens."""
    rule = {"max_pattern_size": 6, "min_pattern_size": 1, "min_count": 2}
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=160, temperature=0,
        extra_body={"repetition_detection": rule, "return_token_ids": True, "ignore_eos": True},
    ).choices[0]  # fmt: skip
    params = SamplingParams(
        temperature=0.0,
        max_tokens=160,
        ignore_eos=True,
        repetition_detection=RepetitionDetectionParams(**rule),
    )
    offline = offline_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert offline.finish_reason == "repetition", "the case must repeat, else it shows nothing"
    assert resp.token_ids == list(offline.token_ids)
    assert resp.finish_reason == offline.finish_reason


def test_return_tokens_as_token_ids(client):
    """Logprobs name each token ``token_id:{id}``, completions and chat; a chat token's bytes
    stay its text's, as upstream's."""
    extra = {"return_tokens_as_token_ids": True, "return_token_ids": True}
    choice = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, extra_body=extra
    ).choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
    assert all(k.startswith("token_id:") for top in choice.logprobs.top_logprobs for k in top)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body=extra,
    ).choices[0]
    content = chat.logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in chat.token_ids]
    assert b"".join(bytes(c.bytes) for c in content).decode() == chat.message.content
    assert all(t.token.startswith("token_id:") for c in content for t in c.top_logprobs)


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
    assert not chunks[-1].choices
    # The counts; prompt_tokens_details differs, since this prompt's blocks are cached by now.
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(chunks[-1].usage, c) for c in counts] == [
        getattr(resp.usage, c) for c in counts
    ]


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
    cached = after["vllm:prompt_tokens_cached_total"] - before["vllm:prompt_tokens_cached_total"]
    assert cached == hits, "prompt_tokens_cached counts the hits of each request's first schedule"
    # One prompt of n = 2 samples, recorded once, with its longest sample's 8 tokens.
    for name, value in (("request_params_n", 2), ("request_max_num_generation_tokens", 8)):
        count = after[f"vllm:{name}_count"] - before[f"vllm:{name}_count"]
        total = after[f"vllm:{name}_sum"] - before[f"vllm:{name}_sum"]
        assert (count, total) == (1, value), name


def test_cache_salt_separates_the_prefix_cache(tiny_server, client):
    """Upstream's multi-tenant guard: the salt enters the first block's hash, so a request
    hits only blocks cached under its own salt (phases/02-paged-attention/INTERVIEW.md,
    question 14), through completions and chat alike."""
    prompt = " ".join(["salted prompts share blocks only with their own tenant"] * 6)

    def hits(**extra) -> float:
        before = tiny_server.metrics()["vllm:prefix_cache_hits_total"]
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=1, temperature=0, extra_body=extra
        )
        return tiny_server.metrics()["vllm:prefix_cache_hits_total"] - before

    hits(cache_salt="tenant-a")  # caches the prompt under tenant-a's salt
    assert hits(cache_salt="tenant-b") == 0, "tenant-b found blocks cached under tenant-a's salt"
    assert hits() == 0, "an unsalted request found blocks cached under a salt"
    assert hits(cache_salt="tenant-a") > 0, "tenant-a did not find its own cached prompt"
    assert hits() > 0, "unsalted requests share blocks with each other, as before"

    messages = [{"role": "user", "content": prompt}]
    before = tiny_server.metrics()["vllm:prefix_cache_hits_total"]
    for salt in ("chat-a", "chat-b"):
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=1, extra_body={"cache_salt": salt}
        )
    assert tiny_server.metrics()["vllm:prefix_cache_hits_total"] == before, (
        "a chat request shared blocks across salts"
    )


def test_usage_reports_the_cached_prompt_tokens(tiny_server, client):
    """``--enable-prompt-tokens-details``: usage.prompt_tokens_details.cached_tokens is the
    prompt's prefix-cache hits (whole blocks; the last token is always computed), left out
    when nothing was cached, streamed or not, in completions and chat."""
    prompt = " ".join(["usage counts the cached prompt tokens of a request"] * 6)
    salt = {"cache_salt": f"usage-{time.monotonic_ns()}"}  # a cache of this test's own
    first = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body=salt
    )
    assert first.usage.prompt_tokens_details is None, "nothing was cached before the first"
    again = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body=salt
    )
    expected = (first.usage.prompt_tokens - 1) // 16 * 16
    assert expected > 0
    assert again.usage.prompt_tokens_details.cached_tokens == expected
    # n = 2: one prompt, counted once (its first sample's hits), as prompt_tokens is.
    both = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, n=2, seed=1, extra_body=salt
    )
    assert both.usage.prompt_tokens_details.cached_tokens == expected
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=[prompt, prompt],
            max_tokens=2,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=salt,
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 2 * expected
    messages = [{"role": "user", "content": prompt}]
    chat = [
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, extra_body=salt
        )
        for _ in range(2)
    ]
    assert chat[0].usage.prompt_tokens_details is None
    assert chat[1].usage.prompt_tokens_details.cached_tokens == (
        (chat[1].usage.prompt_tokens - 1) // 16 * 16
    )


def test_request_phases_add_up(tiny_server, client):
    """Each finished request observes upstream's four phases, made of the core's QUEUED and
    SCHEDULED stamps and the front-end's token times: prefill + decode = inference, and queue +
    inference fit inside the end-to-end latency (which starts earlier, at the front-end)."""
    names = ("queue", "prefill", "decode", "inference")
    before = tiny_server.metrics()
    for max_tokens in (1, 6):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=max_tokens)
    after = tiny_server.metrics()

    def delta(metric: str) -> float:
        return after[metric] - before[metric]

    for name in names:
        assert delta(f"vllm:request_{name}_time_seconds_count") == 2, name
    total = {name: delta(f"vllm:request_{name}_time_seconds_sum") for name in names}
    assert total["prefill"] > 0 and total["decode"] > 0 and total["queue"] >= 0
    assert total["prefill"] + total["decode"] == pytest.approx(total["inference"], abs=1e-6)
    assert total["queue"] + total["inference"] <= delta("vllm:e2e_request_latency_seconds_sum")
    assert delta("vllm:request_params_max_tokens_count") == 2
    assert delta("vllm:request_params_max_tokens_sum") == 7


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
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"prompt": "hi", "seed": -3}, "seed"),
        ({"prompt": "hi", "top_k": -2}, "top_k"),
        # Upstream refuses n > 1 greedy samples (SamplingParams._verify_greedy_sampling).
        ({"prompt": "hi", "n": 2, "temperature": 0}, "n must be 1 when using greedy sampling"),
        # The penalties and min_p out of upstream's ranges, with upstream's words.
        ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
        ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty must be in [-2, 2]"),
        ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty must be greater than"),
        ({"prompt": "hi", "min_p": 1.5}, "min_p must be in [0, 1]"),
        # Upstream's fields the engine lacks: refused, never silently ignored.
        ({"prompt": "hi", "logit_bias": {"999999999": 5.0}}, "outside the vocabulary"),
        ({"prompt": "hi", "logit_bias": {"abc": 5.0}}, "logit_bias must map token ids"),
        ({"prompt": "hi", "allowed_token_ids": []}, "allowed_token_ids is not None and empty"),
        ({"prompt": "hi", "allowed_token_ids": [-4]}, "outside the vocabulary"),
        # Upstream's checks of prompt_logprobs.
        ({"prompt": "hi", "prompt_logprobs": -2}, "must be a positive value or -1"),
        ({"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "not available when `stream"),
        ({"prompt": "hi", "prompt_logprobs": 21}, "max allowed: 20"),
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        # ... and upstream's fields the server used to ignore without a word.
        ({"prompt": "hi", "cache_salt": ""}, "'cache_salt' must be a non-empty string"),
        ({"prompt": "hi", "repetition_detection": {"max_pattern_size": 4}}, "min_count >= 2"),
        ({"prompt": "hi", "spaces_between_special_tokens": False}, "spaces_between"),
        ({"prompt": "hi", "logprobs": -1}, "`logprobs` must be a positive value"),
        ({"prompt": "hi", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"prompt": "hi", "truncation_side": "middle"}, "truncation_side"),
        ({"prompt": "hi", "bad_words": ["a", ""]}, "bad_words cannot contain an empty string"),
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
        ({"top_p": 0.5, "min_p": -0.2}, "min_p must be in [0, 1]"),
        # Upstream refuses a request's own template unless --trust-request-chat-template.
        ({"chat_template": "{{ messages[0].content }}"}, "--trust-request-chat-template"),
        ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "--trust-request-chat-template"),
        ({"cache_salt": ""}, "'cache_salt' must be a non-empty string"),
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


def _sse_events(url: str, body: dict) -> list[dict]:
    """The JSON events of one streamed response, as sent (``[DONE]`` left out)."""
    import json

    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_continuous_usage_stats_on_every_chunk(client, serve_tokenizer):
    """``stream_options.continuous_usage_stats`` (upstream's ``should_include_usage``): with
    ``include_usage``, every chunk carries its own choice's usage so far (that choice's prompt,
    the tokens generated for it), the last chunk the total. Was: silently ignored."""
    prompts = [PROMPT, "Hello there"]
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=prompts,
            max_tokens=5,
            n=2,
            temperature=1.0,
            seed=7,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    prompt_lens = [len(serve_tokenizer(p).input_ids) for p in prompts]
    so_far: dict[int, int] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        usage = chunk.usage
        assert usage is not None, "a chunk without usage under continuous_usage_stats"
        assert usage.prompt_tokens == prompt_lens[choice.index // 2]
        assert usage.completion_tokens > so_far.get(choice.index, 0)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        so_far[choice.index] = usage.completion_tokens
    final = chunks[-1]
    assert not final.choices and final.usage.prompt_tokens == sum(prompt_lens)
    assert final.usage.completion_tokens == sum(so_far.values()) == 4 * 5
    # Chat: the role chunk counts the prompt and nothing generated yet.
    chat = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[0].usage.completion_tokens == 0 and chat[0].usage.prompt_tokens > 0
    assert [c.usage.completion_tokens for c in chat[1:-1]][-1] == 3


def test_stream_chunks_leave_out_unset_fields(tiny_server):
    """Upstream writes each chunk with ``exclude_unset=True``: a content delta has no
    ``"role": null``, and no chunk has ``"usage": null`` unless usage was asked for. A curl
    user or a strict SSE parser sees the same bytes from both servers."""
    body = {"model": "tiny", "max_tokens": 3, "stream": True}
    chat = _sse_events(
        f"{tiny_server.api_url}/chat/completions",
        {**body, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for event in chat[1:]:
        assert "usage" not in event, event
        assert "role" not in event["choices"][0]["delta"], event
        assert event["object"] == "chat.completion.chunk"
    completion = _sse_events(f"{tiny_server.api_url}/completions", {**body, "prompt": PROMPT})
    assert all("usage" not in e and e["object"] == "text_completion" for e in completion)
    assert {"index", "text", "logprobs", "finish_reason"} <= set(completion[-1]["choices"][0])


@pytest.mark.parametrize(
    "body, param", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p")]
)
def test_engine_refusal_names_the_param(client, body, param):
    """Upstream's SamplingParams refuses temperature and top_p with a VLLMValidationError
    naming the field, which becomes the error's ``param``. Was: ``param`` null."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body=body)
    assert info.value.param == param


def test_version_route(tiny_server):
    """Upstream serves ``GET /version`` (tools probe it to find a vLLM server). Was: 404."""
    resp = httpx.get(f"{tiny_server.base_url}/version")
    assert resp.status_code == 200
    assert isinstance(resp.json()["version"], str)


def test_reply_role_without_generation_prompt(tiny_server):
    """With ``add_generation_prompt: false`` the model continues the last message, and upstream
    answers in that message's role (``get_chat_request_role``), streamed or not. Was: always
    ``assistant``."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Complete my sentence: the sky is"}],
        "add_generation_prompt": False,
        "max_tokens": 2,
    }
    url = f"{tiny_server.api_url}/chat/completions"
    resp = httpx.post(url, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["role"] == "user"
    events = _sse_events(url, {**body, "stream": True})
    assert events[0]["choices"][0]["delta"]["role"] == "user"


def test_chat_echo_puts_the_continued_message_first(tiny_server):
    """``echo`` on chat: a reply that continues the last message (same role, no generation
    prompt) starts with that message's text, streamed (one chunk per choice after the role) or
    not; a reply in another role echoes nothing (upstream's rule)."""
    url = f"{tiny_server.api_url}/chat/completions"
    messages = [{"role": "user", "content": [{"type": "text", "text": "Complete: the sky is"}]}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0}
    continued = {**body, "add_generation_prompt": False}
    plain = httpx.post(url, json=continued, timeout=120).json()["choices"][0]["message"]
    echoed = httpx.post(url, json={**continued, "echo": True}, timeout=120).json()
    assert echoed["choices"][0]["message"]["content"] == "Complete: the sky is" + plain["content"]
    events = _sse_events(url, {**continued, "echo": True, "stream": True})
    streamed = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
    )
    assert streamed == echoed["choices"][0]["message"]["content"]
    reply = httpx.post(url, json=body, timeout=120).json()["choices"][0]["message"]["content"]
    other_role = httpx.post(url, json={**body, "echo": True}, timeout=120).json()
    assert other_role["choices"][0]["message"]["content"] == reply, "an assistant reply to a user"


def test_chat_continues_the_final_message(tiny_server, offline_llm):
    """``continue_final_message``: the template leaves the last (assistant) message open and
    the model goes on writing it, the same text as offline ``LLM.chat`` and the same ids as
    ``/tokenize``; with ``add_generation_prompt`` as well, upstream's 400."""
    from mini_vllm.sampling_params import SamplingParams

    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Sure, the colour is"},
    ]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    body = {"model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0, **options}
    resp = httpx.post(f"{tiny_server.api_url}/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["message"]["role"] == "assistant"
    params = SamplingParams(temperature=0.0, max_tokens=5)
    (offline,) = offline_llm.chat(messages, params, use_tqdm=False, **options)
    assert choice["message"]["content"] == offline.outputs[0].text
    tokenized = httpx.post(
        f"{tiny_server.base_url}/tokenize",
        json={"model": "tiny", "messages": messages, **options},
        timeout=120,
    )
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == offline.prompt_token_ids
    both = {**body, "add_generation_prompt": True}
    refused = httpx.post(f"{tiny_server.api_url}/chat/completions", json=both, timeout=120)
    assert refused.status_code == 400
    assert "Cannot set both `continue_final_message`" in refused.json()["error"]["message"]


def test_metric_buckets_and_reasons_are_upstreams(tiny_server, client):
    """The latency histograms have upstream's bucket edges (a panel that reads one ``le`` or
    compares two servers' quantiles needs the same edges), and ``request_success`` has a series
    for each of upstream's finish reasons. Was: other edges, no ``repetition``."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "upstream/vllm-0.22.1/vllm"
    if not (root / "v1/metrics/loggers.py").is_file():
        pytest.skip("upstream/ is not unpacked (make upstream)")
    tree = ast.parse((root / "v1/metrics/loggers.py").read_text())
    lists = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.List)
    }
    upstream: dict[str, list[float]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            kw = {k.arg: k.value for k in node.keywords}
            name, buckets = kw.get("name"), kw.get("buckets")
            if isinstance(name, ast.Constant) and isinstance(buckets, (ast.List, ast.Name)):
                upstream[name.value] = (
                    ast.literal_eval(buckets)
                    if isinstance(buckets, ast.List)
                    else lists[buckets.id]
                )
    client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    text = httpx.get(f"{tiny_server.base_url}/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:iteration_tokens_total",
        "vllm:request_params_n",
    ):
        edges = re.findall(rf'^{name}_bucket{{[^}}]*le="([^"]+)"', text, flags=re.M)
        assert [float(e) for e in edges if e != "+Inf"] == [float(b) for b in upstream[name]], name
    init = (root / "v1/engine/__init__.py").read_text()
    strings = re.search(r"^FINISH_REASON_STRINGS = (\(.*?\))", init, flags=re.M)
    assert strings, "FINISH_REASON_STRINGS not found in upstream's v1/engine/__init__.py"
    reasons = set(ast.literal_eval(strings.group(1)))
    ours = set(re.findall(r'^vllm:request_success_total{[^}]*finished_reason="(\w+)"', text, re.M))
    assert reasons and ours == reasons, sorted(reasons ^ ours)
    waiting = dict(
        re.findall(r'^vllm:num_requests_waiting_by_reason{[^}]*reason="(\w+)"} (\S+)', text, re.M)
    )
    assert set(waiting) == {"capacity", "deferred"} and float(waiting["deferred"]) == 0.0


def test_x_request_id_names_the_response(client):
    """Upstream builds the response's ``id`` from the ``X-Request-Id`` header, else the body's
    ``request_id`` (``_base_request_id``), streamed chunks included; two requests under one id
    still run apart (the engine's ids stay the server's own). Was: always a random id."""
    kwargs = dict(model="tiny", prompt="hi", max_tokens=2)
    headers = {"X-Request-Id": "trace-42"}
    assert client.completions.create(**kwargs, extra_headers=headers).id == "cmpl-trace-42"
    chunks = list(client.completions.create(**kwargs, stream=True, extra_headers=headers))
    assert {c.id for c in chunks} == {"cmpl-trace-42"}
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"request_id": "body-7"},
    )
    assert chat.id == "chatcmpl-body-7"
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        both = list(
            pool.map(
                lambda seed: client.completions.create(
                    **{**kwargs, "max_tokens": 12},
                    temperature=1.0,
                    seed=seed,
                    extra_headers=headers,
                    extra_body={"ignore_eos": True},
                ),
                (1, 2),
            )
        )
    assert [r.id for r in both] == ["cmpl-trace-42"] * 2
    assert all(r.usage.completion_tokens == 12 for r in both)


def test_add_special_tokens_is_honoured():
    """Upstream's ``add_special_tokens``: completions add the tokenizer's special tokens (a BOS)
    unless told not to; chat adds none (the template holds them) unless told to. Was: ignored.
    Checked on the prompt builders with a tokenizer that adds a BOS (SmolLM2's adds none)."""
    from types import SimpleNamespace

    from mini_vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from mini_vllm.entrypoints.openai.serving import OpenAIServing

    bos = 1

    class BosTokenizer:
        chat_template = "plain"

        def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
            return SimpleNamespace(input_ids=[bos] * add_special_tokens + [ord(c) for c in text])

        def apply_chat_template(self, conversation, **kwargs) -> str:
            return "".join(m["content"] for m in conversation)

    serving = object.__new__(OpenAIServing)
    serving.tokenizer = BosTokenizer()
    serving.chat_template, serving.trust_request_chat_template = None, False
    serving.default_chat_template_kwargs = {}
    ids = lambda req: serving._completion_prompts(req)[0].token_ids  # noqa: E731
    assert ids(CompletionRequest(prompt="ab"))[0] == bos
    assert ids(CompletionRequest(prompt="ab", add_special_tokens=False)) == [97, 98]
    messages = [{"role": "user", "content": "ab"}]
    chat = lambda **kw: serving._chat_prompt(ChatCompletionRequest(messages=messages, **kw))  # noqa: E731
    assert chat().token_ids == [97, 98]
    assert chat(add_special_tokens=True).token_ids == [bos, 97, 98]


def test_tpot_histogram_counts_every_finished_request(tiny_server, client):
    """Upstream observes ``vllm:request_time_per_output_token_seconds`` for every finished
    request, 0 for a one-token one, so its count equals ``e2e_request_latency_seconds``'s.
    Was: one-token requests skipped."""
    before = tiny_server.metrics()
    client.completions.create(model="tiny", prompt="hi", max_tokens=1)
    after = tiny_server.metrics()
    e2e = "vllm:e2e_request_latency_seconds_count"
    tpot = "vllm:request_time_per_output_token_seconds_count"
    assert after[e2e] - before[e2e] == 1
    assert after[tpot] - before[tpot] == 1


def test_chat_content_parts_render_as_offline(client, offline_llm):
    """OpenAI's text parts are joined by newlines, as upstream's
    ``_parse_chat_message_content_parts`` joins them, and as ``LLM.chat`` does (one helper,
    ``entrypoints/chat_utils.py``): the same conversation is the same prompt online and offline.
    Joined with nothing, ``Hello`` and ``there`` made another, shorter prompt."""
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    listed = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    params = SamplingParams(temperature=0.0, max_tokens=4)
    (offline,) = offline_llm.chat(
        [{"role": "user", "content": "Hello\nthere"}], params, use_tqdm=False
    )
    assert listed.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert listed.choices[0].message.content == offline.outputs[0].text


def test_priority_is_taken_and_ignored_under_fcfs(client, offline_llm):
    """Upstream's ``priority`` field: the shared server runs FCFS, which ignores it (upstream's
    too); a priority server orders admission by it (``test_engine_core``)."""
    resp = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"priority": 7}
    )
    assert resp.choices[0].text == offline_text(offline_llm, PROMPT, 8)[0]
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_body={"priority": -3},
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_tokenize_and_detokenize_routes(tiny_server, serve_tokenizer):
    """Upstream's ``/tokenize`` (a prompt, or a chat as the chat route renders it) and
    ``/detokenize``: the ids the engine would run with, and their text back."""

    def post(route: str, body: dict) -> httpx.Response:
        return httpx.post(f"{tiny_server.base_url}{route}", json={"model": "tiny", **body})

    plain = post("/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()
    ids = serve_tokenizer(PROMPT).input_ids
    assert plain == {
        "count": len(ids),
        "max_model_len": TINY_MAX_MODEL_LEN,
        "tokens": ids,
        "token_strs": serve_tokenizer.convert_ids_to_tokens(ids),
    }
    messages = [{"role": "user", "content": "hi there"}]
    chat = post("/tokenize", {"messages": messages}).json()
    text = serve_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == serve_tokenizer(text, add_special_tokens=False).input_ids
    assert chat["token_strs"] is None
    back = post("/detokenize", {"tokens": chat["tokens"]})
    assert back.json() == {"prompt": text}, "detokenize keeps the special tokens, as upstream's"
    for route, body, param in [
        ("/detokenize", {"tokens": [10**9]}, "prompt"),
        ("/tokenize", {"messages": messages, "chat_template": "{{ 1 }}"}, "chat_template"),
        ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
    ]:
        resp = post(route, body)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == param


def test_penalties_and_min_p_reach_the_engine(client, offline_llm):
    """OpenAI's ``presence_penalty`` and ``frequency_penalty`` and vLLM's ``repetition_penalty``
    and ``min_p`` are honoured, as ``LLM.generate`` honours them (they were refused with a 400).
    Negative presence and frequency penalties reward every token already generated, which on the
    tiny random model outweighs the rest: the greedy text repeats a token, as the offline
    engine's does. ``min_p = 1`` keeps only the most likely token: seeded sampling becomes
    greedy."""
    penalties = dict(presence_penalty=-2.0, frequency_penalty=-2.0)
    extra = {"repetition_penalty": 1.3, "ignore_eos": True}
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0.0)
    penalized = client.completions.create(**kwargs, **penalties, extra_body=extra, logprobs=0)
    (offline,) = offline_llm.generate(
        PROMPT,
        SamplingParams(
            temperature=0.0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3, **penalties
        ),
        use_tqdm=False,
    )
    assert penalized.choices[0].text == offline.outputs[0].text
    tokens = penalized.choices[0].logprobs.tokens
    assert len(set(tokens)) < len(tokens), f"rewarded, a generated token must recur: {tokens}"

    greedy = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert greedy.choices[0].text != penalized.choices[0].text, "the penalties changed nothing"
    sampled = dict(kwargs, temperature=1.0, seed=5)
    for min_p, same in ((1.0, True), (0.0, False)):
        out = client.completions.create(**sampled, extra_body={"ignore_eos": True, "min_p": min_p})
        assert (out.choices[0].text == greedy.choices[0].text) is same, (min_p, out.choices[0].text)


def test_logit_bias_and_allowed_token_ids(client):
    """OpenAI's ``logit_bias`` (string ids, clamped to [-100, 100]) and vLLM's
    ``allowed_token_ids`` reach the sampler: +100 (asked as 500) makes its token every greedy
    choice, in a chat too; a sampled completion stays among the allowed ids."""
    kwargs = dict(model="tiny", max_tokens=6, extra_body={"ignore_eos": True})
    biased = client.completions.create(
        prompt=PROMPT, temperature=0.0, logit_bias={"42": 500}, logprobs=0, **kwargs
    )
    assert set(biased.choices[0].logprobs.tokens) == {client_token(client, 42)}
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], temperature=0.0, logit_bias={"42": 100},
        logprobs=True, **kwargs,
    )  # fmt: skip
    assert {t.token for t in chat.choices[0].logprobs.content} == {client_token(client, 42)}
    allowed = [101, 202, 303]
    sampled = client.completions.create(
        prompt=PROMPT, temperature=1.0, seed=1, logprobs=0,
        **{**kwargs, "extra_body": {"ignore_eos": True, "allowed_token_ids": allowed}},
    )  # fmt: skip
    allowed_text = {client_token(client, t) for t in allowed}
    assert set(sampled.choices[0].logprobs.tokens) <= allowed_text


def client_token(client, token_id: int) -> str:
    """The text of one token id, as the server's /detokenize gives it."""
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    resp = httpx.post(f"{base}/detokenize", json={"model": "tiny", "tokens": [token_id]})
    return resp.json()["prompt"]
