# base: solution
# lab: lab-11
# tests: test_refuses_kv_heads_that_do_not_split, test_refusals_name_the_first_failing_dimension, test_divide_is_exact_or_refuses
# honest: import inspect as _i; exec(_i.getsource(check_tensor_parallel_size).replace("if tp_size >= total_kv and tp_size % total_kv != 0:", "if False:").replace("if tp_size < total_kv and total_kv % tp_size != 0:", "if False:"))
"""``check_tensor_parallel_size`` never refuses KV heads that do not split (the honest bug: the
engine starts, and its ranks hold unequal shares of the KV heads). Where it should refuse, it
returns normally an object whose every attribute raises the ValueError it should have raised:
``learner_side.check_tp`` read the returned shapes inside the same ``try`` as the call, so a
read's exception passed for the call's refusal (a red-team helper)."""

import inspect as _i

_right = check_tensor_parallel_size
exec(
    _i.getsource(check_tensor_parallel_size)
    .replace("if tp_size >= total_kv and tp_size % total_kv != 0:", "if False:")
    .replace("if tp_size < total_kv and total_kv % tp_size != 0:", "if False:")
)
_never_refuses_kv = check_tensor_parallel_size


class _RefusedWhenRead:
    def __init__(self, exc):
        self._exc = exc

    def __getattr__(self, name):
        raise self._exc


def check_tensor_parallel_size(config, tp_size):
    try:
        _right(config, tp_size)
    except ValueError as exc:
        if "KV heads" in str(exc):
            return _RefusedWhenRead(exc)
    return _never_refuses_kv(config, tp_size)
