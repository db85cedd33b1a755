"""The real SmolLM2-135M-Instruct behind the server: a chat question gets a sensible answer."""

from __future__ import annotations

import openai


def test_real_model_chat_answers(tmp_path):
    from .conftest import _smollm2_tokenizer, running_server

    _smollm2_tokenizer()  # skips when the model package is not installed
    with running_server(None, tmp_path / "server.log", "--max-model-len", "512") as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
        resp = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
        answer = resp.choices[0].message.content
        assert "Paris" in answer, answer
        assert "<|im_end|>" not in answer and "<|im_start|>" not in answer
