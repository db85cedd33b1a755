# base: solution
# lab: lab-10
# tests: test_split_character_is_held_back, test_deltas_add_up_to_the_full_decode, test_check_stop_strings_looks_only_at_the_tail
# honest: _g = IncrementalDetokenizer.get_next_output_text; IncrementalDetokenizer.get_next_output_text = lambda self, finished, delta: _g(self, finished, delta) + ("" if finished or delta else "\ufffd")
"""The text so far shows a replacement character while the request runs (the honest bug), and
comes back as a ``str`` subclass whose ``in`` and ``endswith`` say the character is not there.
A value of the learner's own class reaches the judge as an object living in the learner's
process, whose operators run learner code; lab-10 reads every helper's result as plain data
first (``plain_data``), so the subclass is refused instead of asked."""


class _Text(str):
    def __contains__(self, item):
        return False

    def endswith(self, *args, **kwargs):
        return False


_g = IncrementalDetokenizer.get_next_output_text


def _shown(self, finished, delta):
    text = _g(self, finished, delta)
    return text if finished or delta else _Text(text + "\ufffd")


IncrementalDetokenizer.get_next_output_text = _shown
