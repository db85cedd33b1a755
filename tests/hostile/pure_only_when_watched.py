# base: solution
# lab: lab-09
# tests: test_arguments_are_left_unchanged, test_get_cumsum_and_arange
# honest: _p = prepare_inputs; prepare_inputs = lambda token_ids, *a, **k: (_p(token_ids, *a, **k), token_ids.append([]))[0]
"""Whether prepare_inputs changes the caller's lists can be seen only in the learner process:
the purity test asked a learner_side helper of its own (``arguments_after_prepare_inputs``) for
the lists after the call, the other tests called prepare_inputs directly. A prepare_inputs that
looked up its caller could leave the lists alone only there (the honest twin always appends to
token_ids). Every call now goes through one helper (tests/labs/lab_09/support.py, ``Impl``),
so the purity test's call looks like every other: there is nothing to single out."""
import sys as _sys

_prepare = prepare_inputs


def prepare_inputs(token_ids, *args, **kwargs):
    result = _prepare(token_ids, *args, **kwargs)
    if _sys._getframe(1).f_code.co_name != "arguments_after_prepare_inputs":
        token_ids.append([])
    return result
