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
