"""quiz-01: the phase 01 self-check, scored like a lab.

The key is stored as salted digests, so the answers are not written here to be read at a
glance; QUIZ.md explains each one after you have answered. A digest of one of four letters is
no secret from someone who hashes the four (it keeps a self-check honest, not a graded quiz):
an instructor grading it for credit keeps the key in a private suite
(docs/instructors.md#hidden-tests). ``answers.py`` is imported in the learner process;
``ANSWERS`` comes back as plain data (a dict of strings) and is checked here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from grading.suite import graded, load_impl
from tests.labs.common import describe

DOC = "phases/01-engine-tour/README.md"
POOL = "kvcachemanager-and-blockpool-which-blocks"
SCHED = "scheduler-who-runs-this-step-and-how-many-tokens"
QUIZ = "phases/01-engine-tour/QUIZ.md"

#: question -> (digest of the right letter, short title, the section that teaches it)
KEY: dict[int, tuple[str, str, str]] = {
    1: ("39b35e17370e8930", "the seam", "the-map"),
    2: ("42f83bdecac5516b", "out of blocks", SCHED),
    3: ("0acb8182f4a97081", "a fully cached prompt", POOL),
    4: ("c59533476c525a7d", "preemption", "5-what-changes-under-pressure"),
    5: ("d99fd84b31be752e", "ahead of time", SCHED),
    6: ("549ba994540827ee", "where does it go", "the-model-runner-block-ids-become-tensors"),
    7: ("d18c99af646cdc13", "stop strings", "llmengine-inputs-in-outputs-out"),
    8: ("222e451d8d182c3b", "the order blocks come back", "3-steps-2-and-3-decode"),
    9: ("02a231c7a0fdf3ca", "when a block becomes a hit", POOL),
    10: ("96ea901dae8eddc0", "processes", "llmengine-inputs-in-outputs-out"),
}


def _digest(question: int, letter: str) -> str:
    return hashlib.sha256(f"mini-vllm quiz-01 q{question}: {letter}".encode()).hexdigest()[:16]


def _make_test(question: int, digest: str, title: str, anchor: str) -> Callable[[], None]:
    @graded(
        1,
        f"question {question} ({title}): reread this section of the engine tour, then "
        f"the explanation under 'Answers' in {QUIZ}",
        f"{DOC}#{anchor}",
    )
    def test() -> None:
        answers = getattr(load_impl("answers"), "ANSWERS", {})
        # ANSWERS arrives from the learner process as plain data: a dict of str, or it is
        # refused (no learner object gets to say what its letter is).
        assert type(answers) is dict, (
            f"ANSWERS must be a dict {{question number: 'A'-'D'}}, got {describe(answers)}"
        )
        if question not in answers and str(question) in answers:
            raise AssertionError(
                f"question {question}: ANSWERS has the key {str(question)!r}, a string; the "
                f"keys are the question numbers as ints ({question}: 'A')"
            )
        letter = answers.get(question, "")
        assert type(letter) is str, (
            f"question {question}: the answer must be a letter in a string, got {describe(letter)}"
        )
        letter = letter.strip().upper()
        if not letter:
            raise NotImplementedError(
                f"quiz-01: answer question {question} ({title}) in answers.py"
            )
        assert letter in {"A", "B", "C", "D"}, f"answer with one letter A-D, not {letter!r}"
        assert _digest(question, letter) == digest, (
            f"question {question} ({title}): {letter} is not the right answer"
        )

    test.__name__ = test.__qualname__ = f"test_q{question:02d}_{title.replace(' ', '_')}"
    test.__doc__ = f"Question {question}: {title}."
    return test


for _q, (_digest_value, _title, _anchor) in KEY.items():
    _fn = _make_test(_q, _digest_value, _title, _anchor)
    globals()[_fn.__name__] = _fn
