"""The shim itself: it maps ``vllm.*`` onto mini_vllm only while installed, and leaves no trace.

Collected after ``selected.txt`` (pytest sorts a folder's entries), so the leak checks below
also cover the upstream suite that just ran in the same process.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import fields

import pytest

from mini_vllm.core import kv_cache_utils as mini_kv_cache_utils
from mini_vllm.core.block_pool import BlockPool as MiniBlockPool
from mini_vllm.core.kv_cache_manager import KVCacheManager as MiniKVCacheManager
from mini_vllm.core.sched.output import SchedulerOutput as MiniSchedulerOutput
from mini_vllm.request import Request as MiniRequest

from . import shim


def _vllm_modules() -> list[str]:
    return [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]


def test_nothing_of_the_shim_outlives_it() -> None:
    assert _vllm_modules() == []
    assert shim.Shim.get().finder not in sys.meta_path
    assert "tests.v1.kv_connector.unit.utils" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("vllm.v1.core.block_pool")


def test_mirrored_modules_read_mini_vllm_live() -> None:
    saved = mini_kv_cache_utils.NONE_HASH
    with shim.installed():
        kv_cache_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        assert kv_cache_utils.KVCacheBlock is mini_kv_cache_utils.KVCacheBlock
        kv_cache_utils.init_none_hash(mini_kv_cache_utils.sha256)
        # Reads go to the live module, so a rebinding by init_none_hash is seen.
        assert kv_cache_utils.NONE_HASH is mini_kv_cache_utils.NONE_HASH
        assert importlib.reload(kv_cache_utils) is kv_cache_utils
        from vllm.v1.request import Request

        assert issubclass(Request, MiniRequest)
    assert saved == mini_kv_cache_utils.NONE_HASH  # restored on uninstall


def test_upstream_only_names_fail_when_used_not_when_imported() -> None:
    with shim.installed():
        from vllm.lora.request import LoRARequest
        from vllm.v1.core.kv_cache_utils import need_extra_keys

        assert isinstance(None, LoRARequest | None)  # usable in annotations and isinstance
        with pytest.raises(shim.UpstreamOnlyError, match="no LoRA adapters"):
            LoRARequest("adapter", 1, "/path")
        with pytest.raises(NotImplementedError, match="hash keys are not mirrored"):
            need_extra_keys(None)


def test_adapters_refuse_features_mini_vllm_lacks() -> None:
    with shim.installed():
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=4, structured_outputs=None)
        Request("ok", [1, 2], params, None)
        assert Request("salted", [1, 2], params, None, cache_salt="s").cache_salt == "s"
        with pytest.raises(shim.UpstreamOnlyError, match="lora_request"):
            Request("adapted", [1, 2], params, None, lora_request=object())
        with pytest.raises(shim.UpstreamOnlyError, match="structured_outputs"):
            SamplingParams(max_tokens=4, structured_outputs={"json": {}})


def test_manager_adapter_keeps_upstream_views() -> None:
    with shim.installed():
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        config = KVCacheConfig(
            num_blocks=5,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=4))],
        )
        manager = KVCacheManager(config, max_model_len=64, hash_block_size=4)
        view = manager.coordinator.single_type_managers[0]
        assert view.req_to_blocks is manager.req_to_blocks
        assert manager.block_pool.get_num_free_blocks() == 4
        with pytest.raises(shim.UpstreamOnlyError, match="hash_block_size"):
            KVCacheManager(config, max_model_len=64, hash_block_size=2)
        hybrid = KVCacheConfig(5, [], [config.kv_cache_groups[0], config.kv_cache_groups[0]])
        with pytest.raises(shim.UpstreamOnlyError, match="one full-attention group"):
            KVCacheManager(hybrid, max_model_len=64, hash_block_size=4)


def test_unset_arguments_are_recognised_without_comparing_values() -> None:
    class Ambiguous:  # like a tensor: == does not give one bool
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("ambiguous")

        __hash__ = object.__hash__

    shim.reject_unsupported("X", a=None, b=False, c=0, d=(), e=[], f={})
    with pytest.raises(shim.UpstreamOnlyError, match=r"X\(g=.*\): g is not mirrored"):
        shim.reject_unsupported("X", g=Ambiguous())


def test_sizing_adapters_size_one_full_attention_group_only() -> None:
    with shim.installed():
        from vllm.config import ModelConfig, VllmConfig
        from vllm.v1.core.kv_cache_utils import estimate_max_model_len, get_kv_cache_configs
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        config = VllmConfig(model_config=ModelConfig(max_model_len=64))
        full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="float16")
        block = 2 * 16 * 2 * 8 * 2  # K and V, 16 tokens, 2 heads of 8, fp16: one layer
        (kv_config,) = get_kv_cache_configs(config, [{"a": full, "b": full}], [10 * 2 * block])
        assert kv_config.num_blocks == 10
        assert [t.size for t in kv_config.kv_cache_tensors] == [10 * block, 10 * block]
        assert estimate_max_model_len(config, {"a": full}, 3 * block) == 48
        window = SlidingWindowSpec(
            block_size=16, num_kv_heads=2, head_size=8, dtype="float16", sliding_window=32
        )
        with pytest.raises(shim.UpstreamOnlyError, match="one full-attention KV cache group"):
            get_kv_cache_configs(config, [{"a": full, "b": window}], [10**6])
        wide = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype="float16")
        with pytest.raises(shim.UpstreamOnlyError, match="share one KV cache shape"):
            get_kv_cache_configs(config, [{"a": full, "b": wide}], [10**6])
        with pytest.raises(shim.UpstreamOnlyError, match="one GPU"):
            get_kv_cache_configs(config, [{"a": full}, {"b": full}], [10**6, 10**6])
        with pytest.raises(ValueError, match="max seq len"):
            get_kv_cache_configs(config, [{"a": full}], [4 * block])  # 64 tokens need 4 + null


def test_event_api_lives_in_the_shim_not_in_the_engine() -> None:
    assert not hasattr(MiniBlockPool, "take_events")
    assert not hasattr(MiniKVCacheManager, "take_events")
    assert "enable_kv_cache_events" not in inspect.signature(MiniBlockPool).parameters
    with shim.installed():
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        pool = BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=4)
        assert pool.take_events() == [] and pool.get_num_free_blocks() == 3
        with pytest.raises(shim.UpstreamOnlyError, match="enable_kv_cache_events"):
            BlockPool(4, True, 4, enable_kv_cache_events=True)
        config = KVCacheConfig(5, [], [KVCacheGroupSpec(["layer"], FullAttentionSpec(4))])
        assert KVCacheManager(config, max_model_len=64, hash_block_size=4).take_events() == []
        with pytest.raises(shim.UpstreamOnlyError, match="enable_kv_cache_events"):
            KVCacheManager(config, 64, 4, enable_kv_cache_events=True)


@pytest.mark.parametrize(("caching", "expected"), [(True, [2]), (False, [0])])
def test_scheduler_adapter_fills_in_the_common_prefix(caching: bool, expected: list[int]) -> None:
    assert "num_common_prefix_blocks" not in {f.name for f in fields(MiniSchedulerOutput)}
    with shim.installed():
        from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, sha256
        from vllm.v1.core.sched.output import SchedulerOutput
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        config = VllmConfig(
            scheduler_config=SchedulerConfig(max_model_len=64),
            cache_config=CacheConfig(block_size=4, enable_prefix_caching=caching),
        )
        kv_config = KVCacheConfig(11, [], [KVCacheGroupSpec(["layer"], FullAttentionSpec(4))])
        sched = Scheduler(config, kv_config, None, block_size=4)
        assert sched.schedule().num_common_prefix_blocks == [0]  # nothing runs
        hasher = get_request_block_hasher(4, sha256)
        for req_id, prompt in (("a", list(range(9))), ("b", [*range(8), 50, 51])):
            params = SamplingParams(max_tokens=4)
            sched.add_request(Request(req_id, prompt, params, None, block_hasher=hasher))
        out = sched.schedule()
        # a holds blocks 1-3; with caching b shares 1 and 2 (ref_cnt 2 = every request).
        assert isinstance(out, SchedulerOutput) and out.num_common_prefix_blocks == expected
        assert out.num_scheduled_tokens == {"a": 9, "b": 2 if caching else 10}
        runner_output = ModelRunnerOutput(["a", "b"], {"a": 0, "b": 1}, [[7], [8]])
        sched.update_from_output(out, runner_output)  # the adapter's copy is a real output
        assert [r.output_token_ids for r in sched.running] == [[7], [8]]
