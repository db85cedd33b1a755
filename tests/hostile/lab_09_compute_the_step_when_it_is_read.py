# base: solution
# lab: lab-09
# tests: test_no_python_work_per_token, test_decode_only_batch
# honest: import inspect as _i; exec(compile(_i.getsource(prepare_inputs).replace("slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)", "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())], dtype=np.int64)"), __file__, "exec"))
"""``prepare_inputs`` computes the slot mapping in a comprehension over the tokens (the honest
bug: Python work per token at every step). The attack returns an object that prepares the step
only when one of its fields is first read. lab-09's cost test read the result outside its line
trace (``lines_run`` turned the trace off, then read the summary), and timed 20 calls of which it
read only the last: the per-token lines ran untraced, once instead of 20 times, and kept the
test's 2 points (a red-team helper)."""

import inspect as _i

exec(
    compile(
        _i.getsource(prepare_inputs).replace(
            "slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
            "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size"
            " + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())],"
            " dtype=np.int64)",
        ),
        __file__,  # the learner's own file: its lines are traced as the honest bug's are
        "exec",
    )
)
_per_token = prepare_inputs


class _PreparedWhenRead:
    def __init__(self, args, kwargs):
        self._args, self._kwargs, self._done = args, kwargs, None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._done is None:
            self._done = _per_token(*self._args, **self._kwargs)
        return getattr(self._done, name)


def _copy(arg):
    """The caller's lists as they are now (the step is prepared later, when it is read)."""
    if isinstance(arg, list | tuple):
        return [_copy(x) for x in arg] if arg and isinstance(arg[0], list | tuple) else list(arg)
    return arg


def prepare_inputs(*args, **kwargs):
    return _PreparedWhenRead([_copy(a) for a in args], kwargs)
