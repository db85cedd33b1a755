"""``--api-key``: the OpenAI routes want a bearer key, the probes and the metrics do not."""

from __future__ import annotations

import httpx
import openai
import pytest

from mini_vllm.__main__ import build_parser

from .conftest import running_server, tiny_args


@pytest.fixture(scope="module")
def locked_server(tiny_serve_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("auth") / "server.log"
    with running_server(tiny_serve_dir, log_path, *tiny_args(), "--api-key", "k1", "k2") as server:
        yield server


def _complete(server, api_key: str) -> str:
    client = openai.OpenAI(base_url=server.api_url, api_key=api_key, max_retries=0)
    return client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].text


@pytest.mark.parametrize("key", ["k1", "k2"])
def test_any_listed_key_is_let_in(locked_server, key):
    assert isinstance(_complete(locked_server, key), str)


@pytest.mark.parametrize("key", ["k", "K1", "k1k2", "k1 k2"])
def test_a_wrong_key_is_401(locked_server, key):
    with pytest.raises(openai.AuthenticationError) as info:
        _complete(locked_server, key)
    assert info.value.status_code == 401


def test_only_the_openai_routes_are_guarded(locked_server):
    def models(authorization: str | None) -> int:
        headers = {} if authorization is None else {"Authorization": authorization}
        return httpx.get(f"{locked_server.api_url}/models", headers=headers).status_code

    assert [models(None), models("Bearer"), models("Basic k1")] == [401, 401, 401]
    assert models("bearer k1") == 200, "the scheme is case-insensitive, as upstream's"
    for route in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{locked_server.base_url}{route}").status_code == 200, (
            f"{route} must stay open: probes and scrapers carry no key"
        )


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        (["serve"], None, None),
        (["serve"], "from-env", ["from-env"]),
        (["serve", "--api-key", "a", "b"], "from-env", ["a", "b"]),
    ],
)
def test_the_command_line_key_wins_over_vllm_api_key(monkeypatch, argv, env, expected):
    pytest.importorskip("fastapi")
    from mini_vllm.entrypoints.openai.api_server import AuthenticationMiddleware, build_app

    if env is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", env)
    app = build_app(build_parser().parse_args(argv))
    guards = [m for m in app.user_middleware if m.cls is AuthenticationMiddleware]
    assert [m.kwargs["tokens"] for m in guards] == ([] if expected is None else [expected])
