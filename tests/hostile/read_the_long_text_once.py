# base: solution
# lab: lab-10
# tests: test_stop_search_reads_only_the_tail, test_check_stop_strings_looks_only_at_the_tail
# honest: _c = check_stop_strings; check_stop_strings = lambda t, n, stops, inc: ([t.count(s) for s in stops], _c(t, n, stops, inc))[1]
# not defended: the cost test's 100 calls share one text object (a new 4 MB text a call would cost more than the search it times), so whole-text work done once per text object is paid once; an engine's output grows into a new string each step, where it is paid every step
"""``check_stop_strings`` reads the whole text (the honest bug, ``str.count`` of each stop
string, O(the text) a call), but only the first time it sees a long text object: the cost
test asks 100 questions of one text, so the whole text is read once (a red-team helper)."""

_tail_search = check_stop_strings
_seen = set()


def _read_once(output_text, new_char_count, stop, include_in_output):
    if len(output_text) < 100_000 or id(output_text) not in _seen:
        _seen.add(id(output_text))
        for stop_str in stop:
            output_text.count(stop_str)  # the whole text
    return _tail_search(output_text, new_char_count, stop, include_in_output)


check_stop_strings = _read_once
