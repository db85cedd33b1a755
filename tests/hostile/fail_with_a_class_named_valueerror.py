# base: solution
# lab: lab-10
# tests: test_error_output_fails_the_request, test_aborts
# honest: ValueError = RuntimeError
"""learner_side._read_output reports an error put on a request's queue as
f"{type(item).__name__}: {item}", the name the learner's class gives itself: a RuntimeError of
the learner's own class named ValueError (a bug: the request fails with the wrong type, and an
``except ValueError`` of the caller misses it) reads as a ValueError."""


class _NotAValueError(RuntimeError):
    pass


_NotAValueError.__name__ = _NotAValueError.__qualname__ = "ValueError"
ValueError = _NotAValueError
