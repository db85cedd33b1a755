"""``LLM.generate``'s text against upstream's: the output processor's rules, offline.

Upstream's offline ``LLM`` runs every request through the same detokenizer as its server
(``RequestOutputKind.FINAL_ONLY``): the EOS or stop token id that ended a request is counted in
``token_ids`` but its text is left out, and the output decodes after the prompt's last tokens.
The EOS ids of ``generation_config.json`` end a request too (upstream's
``try_get_generation_config``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mini_vllm.engine.core import EngineCoreOutput, EngineCoreRequest, EngineCoreSamplingParams
from mini_vllm.engine.output_processor import OutputProcessor
from mini_vllm.sampling_params import SamplingParams

from .conftest import TINY_KV_BYTES, TINY_MAX_MODEL_LEN

PROMPT = "The quick brown fox"


def _greedy(llm, **kwargs):
    params = SamplingParams(temperature=0.0, **kwargs)
    return llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]


def _server_text(tokenizer, prompt_ids, token_ids, finish_reason) -> str:
    processor = OutputProcessor(tokenizer)
    request = EngineCoreRequest("r", prompt_ids, EngineCoreSamplingParams())
    queue = processor.add_request(request, PROMPT, arrival_time=0.0)
    processor.process_outputs([EngineCoreOutput("r", token_ids, finish_reason=finish_reason)])
    return queue.get_nowait().outputs[0].text


def test_stop_token_text_is_left_out(offline_llm):
    tokenizer = offline_llm.get_tokenizer()
    free = _greedy(offline_llm, max_tokens=12, ignore_eos=True)
    # A stop token whose text is not empty, after the first output token.
    index = next(
        i for i in range(1, len(free.token_ids)) if tokenizer.decode([free.token_ids[i]]).strip()
    )
    stop_id = free.token_ids[index]
    out = _greedy(offline_llm, max_tokens=12, stop_token_ids=[stop_id])
    assert out.token_ids == free.token_ids[: index + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    prompt_ids = tokenizer(PROMPT).input_ids
    assert out.text == _server_text(tokenizer, prompt_ids, out.token_ids, "stop")
    assert out.text != tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_generation_config_eos_ids_stop(tiny_serve_dir: Path, tmp_path: Path, offline_llm):
    from mini_vllm.llm import LLM

    free = _greedy(offline_llm, max_tokens=8, ignore_eos=True)
    extra_eos = free.token_ids[3]
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_serve_dir, checkpoint)
    path = checkpoint / "generation_config.json"
    config = json.loads(path.read_text())
    config["eos_token_id"] = [offline_llm.get_tokenizer().eos_token_id, extra_eos]
    path.write_text(json.dumps(config))
    llm = LLM(
        str(checkpoint), max_model_len=TINY_MAX_MODEL_LEN, kv_cache_memory_bytes=TINY_KV_BYTES
    )
    out = _greedy(llm, max_tokens=8)
    assert out.token_ids == free.token_ids[: free.token_ids.index(extra_eos) + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", extra_eos)
    # ignore_eos ignores the generation config's EOS ids too.
    assert _greedy(llm, max_tokens=8, ignore_eos=True).token_ids == free.token_ids


# ---------------------------------------------------------------- the offline API, as vLLM's

MESSAGES = [{"role": "user", "content": "hi"}]


def test_offline_api_is_importable_from_the_package() -> None:
    import subprocess
    import sys

    import mini_vllm
    from mini_vllm import LLM, CompletionOutput, RequestOutput, SamplingParams, TokensPrompt
    from mini_vllm.llm import LLM as LLMFromModule

    assert LLM is LLMFromModule and SamplingParams is mini_vllm.sampling_params.SamplingParams
    assert CompletionOutput is mini_vllm.outputs.CompletionOutput
    assert RequestOutput is mini_vllm.outputs.RequestOutput and TokensPrompt is not None
    # The labs import the package for numpy-only code: the names must not pull in torch early.
    probe = "import sys, mini_vllm; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0, (
        "`import mini_vllm` imported torch: mini_vllm/__init__.py must load LLM lazily"
    )


def test_empty_batches_have_no_outputs(offline_llm) -> None:
    """Upstream's ``LLM.generate([])`` and ``LLM.chat([])`` return ``[]`` (no error)."""
    assert offline_llm.generate([], use_tqdm=False) == []
    assert offline_llm.chat([], use_tqdm=False) == []


def test_chat_takes_upstreams_template_options(offline_llm) -> None:
    """``chat_template``, ``continue_final_message`` and ``chat_template_kwargs`` reach the
    tokenizer's ``apply_chat_template``; each output's ``prompt`` is the rendered text
    (upstream's ``LLM.chat``, ``vllm/entrypoints/llm.py``)."""
    tokenizer = offline_llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=2)
    (out,) = offline_llm.chat(MESSAGES, params, use_tqdm=False)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert out.prompt == rendered, "LLM.chat must report the rendered template as the prompt"
    assert out.prompt_token_ids == tokenizer(rendered, add_special_tokens=False).input_ids

    template = "{{ greeting }}: {{ messages[0]['content'] }}"
    (own,) = offline_llm.chat(
        MESSAGES,
        params,
        use_tqdm=False,
        chat_template=template,
        chat_template_kwargs={"greeting": "hello"},
    )
    assert own.prompt == "hello: hi"

    partial = [*MESSAGES, {"role": "assistant", "content": "Sure, the"}]
    (cont,) = offline_llm.chat(
        partial, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )
    assert cont.prompt is not None and cont.prompt.endswith("Sure, the"), cont.prompt
    with pytest.raises(ValueError):
        offline_llm.chat(partial, params, use_tqdm=False, continue_final_message=True)


def test_use_tqdm_may_be_a_progress_bar_factory(offline_llm) -> None:
    """As upstream, ``use_tqdm`` may be a callable that builds the bar
    (``functools.partial(tqdm, leave=False)``); it is advanced once per finished prompt."""
    bars = []

    class Bar:
        def __init__(self, **kwargs) -> None:
            self.kwargs, self.n, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, n: int) -> None:
            self.n += n

        def close(self) -> None:
            self.closed = True

    outs = offline_llm.generate(["a", "b", "c"], SamplingParams(max_tokens=2), use_tqdm=Bar)
    assert len(outs) == 3 and len(bars) == 1
    assert (bars[0].kwargs["total"], bars[0].n, bars[0].closed) == (3, 3, True)


def test_chat_joins_text_content_parts(offline_llm) -> None:
    """OpenAI-style content parts render as their texts joined by newlines (upstream's
    ``_parse_chat_message_content_parts`` for a string-content template), not as a list repr."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    (listed,) = offline_llm.chat([{"role": "user", "content": parts}], params, use_tqdm=False)
    (joined,) = offline_llm.chat(
        [{"role": "user", "content": "Hello\nthere"}], params, use_tqdm=False
    )
    assert listed.prompt == joined.prompt, listed.prompt
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(ValueError, match="image_url"):
        offline_llm.chat([{"role": "user", "content": image}], params, use_tqdm=False)


def test_stop_strings_end_offline_requests_as_the_servers(offline_llm) -> None:
    """``SamplingParams(stop=...)`` offline: the text is cut before the first stop string (kept
    with ``include_stop_str_in_output``), ``stop_reason`` is the string, and the request ends at
    the token that completed it, its blocks freed (under async scheduling, the default, that
    request is already in the next step when its text is read)."""
    tokenizer = offline_llm.get_tokenizer()
    free = _greedy(offline_llm, max_tokens=16, ignore_eos=True)
    text = free.text
    stop = next(text[i : i + 3] for i in range(4, len(text) - 3) if text[i : i + 3].strip())
    cut = text.index(stop)
    stats = offline_llm.llm_engine.stats
    generated_before = stats.num_generation_tokens
    out = _greedy(offline_llm, max_tokens=16, ignore_eos=True, stop=stop)
    generated = stats.num_generation_tokens - generated_before
    assert (out.text, out.finish_reason, out.stop_reason) == (text[:cut], "stop", stop)
    # The request stopped at the first token whose text completes the stop string.
    prompt_ids = tokenizer(PROMPT).input_ids
    ends = [
        n
        for n in range(1, len(free.token_ids) + 1)
        if stop in _server_text(tokenizer, prompt_ids, free.token_ids[:n], "length")
    ]
    assert ends[0] < len(free.token_ids), "the stop string should end the request early"
    assert out.token_ids == free.token_ids[: ends[0]]
    assert generated == ends[0], (
        f"the request generated {generated} tokens: it must stop in the scheduler at the stop "
        f"string's token ({ends[0]}), not run on to max_tokens"
    )
    kept = _greedy(offline_llm, max_tokens=16, ignore_eos=True, stop=[stop, "\x00"],
                   include_stop_str_in_output=True)  # fmt: skip
    assert kept.text == text[: cut + len(stop)] and kept.stop_reason == stop
    engine = offline_llm.llm_engine
    assert not engine.has_unfinished_requests()
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == engine.num_gpu_blocks - 1, "a stopped request's blocks"


def test_n_samples_share_one_output(offline_llm) -> None:
    """``n > 1`` offline: one ``RequestOutput`` per prompt holding ``n`` samples in index order;
    sample ``i`` of a seeded request is the request with ``seed + i`` (upstream's
    ``ParentRequest``), and greedy ``n > 1`` is refused as upstream refuses it."""
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    outputs = offline_llm.generate([PROMPT, "Hello"], params, use_tqdm=False)
    assert [o.request_id for o in outputs] == sorted(o.request_id for o in outputs)
    for output, prompt in zip(outputs, [PROMPT, "Hello"]):
        assert [c.index for c in output.outputs] == [0, 1, 2]
        for index, completion in enumerate(output.outputs):
            alone = SamplingParams(temperature=1.0, seed=5 + index, max_tokens=6, ignore_eos=True)
            single = offline_llm.generate(prompt, alone, use_tqdm=False)[0].outputs[0]
            assert completion.token_ids == single.token_ids, f"sample {index} of {prompt!r}"
    assert len({tuple(c.token_ids) for c in outputs[0].outputs}) > 1, "samples should differ"
    with pytest.raises(ValueError, match="greedy"):
        SamplingParams(n=2, temperature=0.0)


def test_special_tokens_kept_when_asked(offline_llm) -> None:
    """``skip_special_tokens=False`` with ``include_stop_str_in_output``: an EOS that ended the
    request shows in the text, as upstream's detokenizer leaves it."""
    from mini_vllm.engine.llm_engine import decode_final_output

    tokenizer = offline_llm.get_tokenizer()
    prompt_ids = tokenizer(PROMPT).input_ids
    ids = [*tokenizer(" over", add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    default = decode_final_output(tokenizer, prompt_ids, ids, stop_terminated=True)
    kept = decode_final_output(
        tokenizer,
        prompt_ids,
        ids,
        stop_terminated=True,
        skip_special_tokens=False,
        include_stop_token=True,
    )
    assert (default, kept) == (" over", " over" + tokenizer.eos_token)
