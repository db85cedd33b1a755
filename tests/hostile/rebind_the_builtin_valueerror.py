# base: solution
# lab: lab-11
# tests: test_divide_is_exact_or_refuses, test_shard_range_refuses, test_pad_vocab_size
# honest: ValueError = RuntimeError
"""Every refusal of the module raises a RuntimeError (the honest bug), from a class of its own
named ``ValueError`` that it also binds as ``builtins.ValueError``. The host and lab-11's
learner_side told an exception's builtin bases by ``getattr(builtins, c.__name__) is c``, read
when asked, so after the rebinding the learner's class passed for the builtin. The builtin
exception classes are now taken when the wire module is imported, before any learner code
runs (``wire.builtin_exception_names``)."""
import builtins as _builtins


class ValueError(RuntimeError):  # the attack: a RuntimeError, then the builtin's name
    """A RuntimeError bound as builtins.ValueError."""


_builtins.ValueError = ValueError
