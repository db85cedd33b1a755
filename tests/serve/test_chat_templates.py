"""Chat templates on the server: ``--chat-template`` replaces the tokenizer's,
``--default-chat-template-kwargs`` sets its variables under each request's,
``--trust-request-chat-template`` lets a request bring its own, and ``documents`` and
``return_prompt_text`` reach and report the rendering (upstream's options)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from .conftest import REPO, running_server, tiny_args

SERVER_TEMPLATE = (
    "{% if greeting %}{{ greeting }}:{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if documents %}[{{ documents | map(attribute='title') | join(',') }}]{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def templated_server(tiny_serve_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("templates")
    template_file = folder / "chat.jinja"
    template_file.write_text(SERVER_TEMPLATE)
    extra = (
        "--chat-template",
        str(template_file),
        "--trust-request-chat-template",
        "--default-chat-template-kwargs",
        '{"greeting": "hello"}',
    )
    with running_server(tiny_serve_dir, folder / "server.log", *tiny_args(), *extra) as server:
        yield server


def _chat(server, **body) -> dict:
    resp = httpx.post(
        f"{server.api_url}/chat/completions",
        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **body},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_server_template_renders_every_chat(templated_server, serve_tokenizer):
    """The file's template, not the tokenizer's: the prompt text, its ids and ``/tokenize``."""
    body = _chat(templated_server, return_prompt_text=True, return_token_ids=True)
    assert body["prompt_text"] == "hello:<user>Name a colour.\n<assistant>"
    assert (
        body["prompt_token_ids"]
        == serve_tokenizer(body["prompt_text"], add_special_tokens=False).input_ids
    )
    tokenized = httpx.post(
        f"{templated_server.base_url}/tokenize", json={"model": "tiny", "messages": MESSAGES}
    ).json()
    assert tokenized["tokens"] == body["prompt_token_ids"]
    client = openai.OpenAI(base_url=templated_server.api_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=2,
        stream=True,
        extra_body={"return_prompt_text": True},
    )
    first, *later = [chunk.model_dump() for chunk in stream]
    assert first["prompt_text"] == body["prompt_text"], "the role chunk carries the prompt text"
    assert all(chunk.get("prompt_text") is None for chunk in later)


def test_documents_and_a_trusted_request_template(templated_server):
    with_docs = _chat(
        templated_server, documents=[{"title": "a", "text": "x"}], return_prompt_text=True
    )
    assert with_docs["prompt_text"] == "hello:<user>Name a colour.\n[a]<assistant>"
    ours = _chat(templated_server, chat_template_kwargs={"greeting": "hi"}, return_prompt_text=True)
    assert ours["prompt_text"].startswith("hi:<user>"), "a request's variables win"
    own = "{{ messages[0]['content'] }}!"
    for body in (
        {"chat_template": own},
        {"chat_template_kwargs": {"chat_template": own}},
        # The field wins over the variable; neither reaches the template as a variable.
        {"chat_template": own, "chat_template_kwargs": {"chat_template": "{{ 2 }}"}},
    ):
        answer = _chat(templated_server, return_prompt_text=True, **body)
        assert answer["prompt_text"] == "Name a colour.!"


def test_an_untrusted_request_template_is_refused(tiny_server):
    """Without ``--trust-request-chat-template``, upstream's 400 and words."""
    resp = httpx.post(
        f"{tiny_server.api_url}/chat/completions",
        json={"model": "tiny", "messages": MESSAGES, "chat_template": "{{ 1 }}"},
    )
    assert resp.status_code == 400
    assert "--trust-request-chat-template is not set" in resp.json()["error"]["message"]


def test_a_chat_template_path_that_cannot_be_read_stops_serve(tiny_serve_dir):
    """A string with no Jinja in it is a path; unreadable, serve says so and starts nothing."""
    cmd = [sys.executable, "-m", "mini_vllm", "serve", str(tiny_serve_dir), *tiny_args()]
    proc = subprocess.run(
        [*cmd, "--chat-template", "/nonexistent/chat.jinja", "--port", "9"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "looks like a file path, but it failed to be opened" in proc.stderr
    assert "Traceback" not in proc.stderr
