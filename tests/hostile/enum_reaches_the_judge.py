# base: stub
"""A forged enum member: its class claims to be ``mini_vllm.<module>.os.environ`` and its member
name is a variable of the grader's environment. If the judge looked enums up by walking
attributes and indexing, the reply would decode into the judge's own ``os.environ[...]`` (or any
object reachable from a module) and the secret would be printed in a failure message."""
import enum as _enum

_E = _enum.Enum("_E", {"MINI_VLLM_TEST_SECRET": 1, "environ": 2})
_E.__module__ = "mini_vllm.core.kv_cache_utils"
_E.__qualname__ = "os.environ"
_LEAK = _E.MINI_VLLM_TEST_SECRET
_F = _enum.Enum("_F", {"environ": 1})
_F.__module__ = "mini_vllm.core.kv_cache_utils"
_F.__qualname__ = "os.__dict__"
_WHOLE = _F.environ


def _init_queue(self, blocks):
    self.num_free_blocks = _LEAK
    self.fake_free_list_head = _LEAK
    self.fake_free_list_tail = _LEAK


def _leak(self, *args, **kwargs):
    return [_LEAK, _WHOLE]


FreeKVCacheBlockQueue.__init__ = _init_queue
for _name in ("popleft", "popleft_n", "append", "append_n", "remove", "get_all_free_blocks"):
    setattr(FreeKVCacheBlockQueue, _name, _leak)
