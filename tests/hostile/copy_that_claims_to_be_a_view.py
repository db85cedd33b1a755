# base: solution
# lab: lab-11
# tests: test_shards_are_views, test_column_and_row_shards_concatenate_back
# honest: _st = shard_tensor; shard_tensor = lambda *a: _st(*a).clone(); _sq = shard_qkv_weight; shard_qkv_weight = lambda *a: _sq(*a).clone()
"""Whether a shard shares the weight's storage can be seen only in the learner process
(learner_side._is_view asked the shard for its untyped_storage). A shard that is a copy (a bug)
in a torch.Tensor subclass named torch.Tensor (so it still crosses to the judge by value) can
answer with the weight's storage. The view check reads the storage with torch's C base
classes' methods (tests/labs/lab_11/learner_side.py, _is_view), which no subclass overrides,
so the copy reads as a copy, as its honest twin's does."""
import torch as _torch


class _Copy(_torch.Tensor):
    def untyped_storage(self):
        return self._weight.untyped_storage()


_Copy.__module__ = "torch"
_Copy.__name__ = _Copy.__qualname__ = "Tensor"


def _claim(copy, weight):
    out = copy.as_subclass(_Copy)
    out._weight = weight
    return out


_st = shard_tensor
_sq = shard_qkv_weight
shard_tensor = lambda tensor, *a: _claim(_st(tensor, *a).clone(), tensor)
shard_qkv_weight = lambda tensor, *a: _claim(_sq(tensor, *a).clone(), tensor)
