# base: solution
# lab: lab-09
# tests: test_arguments_are_left_unchanged, test_get_cumsum_and_arange
# honest: _p = prepare_inputs; prepare_inputs = lambda token_ids, *a, **k: (_p(token_ids, *a, **k), token_ids.append([]))[0]
# not defended: learner-process self-report (docs/grader.md, "What the learner process reports about itself")
"""``prepare_inputs`` appends to the caller's ``token_ids`` (the honest bug), and the suite's
learner-side helper that reports the arguments after the call, which runs in the learner's own
process, is replaced by one that runs it on copies and reports the arguments as they were. Whether a function leaves its
arguments alone can be seen only inside that process, where the submission rewrites anything."""
_p = prepare_inputs
prepare_inputs = lambda token_ids, *a, **k: (_p(token_ids, *a, **k), token_ids.append([]))[0]

import copy as _copy  # noqa: E402

import learner_side as _ls  # noqa: E402


def _reported(*args, **kwargs):
    before = _copy.deepcopy([list(args), kwargs])
    inputs = prepare_inputs(*_copy.deepcopy(args), **kwargs)  # the caller's lists never change
    _ls._GIVEN.append(before[0])  # what the helper reads again after later calls, as it was
    return [inputs, *before]


_ls.prepare_inputs = _reported
