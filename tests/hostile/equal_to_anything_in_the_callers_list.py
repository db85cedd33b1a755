# base: solution
# lab: lab-10
# tests: test_stop_terminated_token_left_out, test_ascii_one_token_a_step
# honest: _u = IncrementalDetokenizer.update; IncrementalDetokenizer.update = lambda self, ids, finished=False, stop_terminated=False: [_u(self, ids, finished, stop_terminated), stop_terminated and ids and not self.include_stop_str_in_output and ids.pop()][0]
"""``update`` pops the stop token from the caller's list of new token ids (the honest bug), and
puts an object of its own in its place that says it equals anything. ``learner_side`` compared
the caller's list with a copy *in the learner process* (``given != list(chunk)``), where the
learner's object answers the comparison: the change was not seen. A helper sends both lists
back to be compared in the judge (where a learner object is a handle, refused as a value), or
compares only values of exact builtin types."""


class _SameAsAnything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


_u = IncrementalDetokenizer.update


def _update(self, ids, finished=False, stop_terminated=False):
    out = _u(self, ids, finished, stop_terminated)
    if stop_terminated and ids and not self.include_stop_str_in_output:
        ids.pop()
        ids.append(_SameAsAnything())
    return out


IncrementalDetokenizer.update = _update
