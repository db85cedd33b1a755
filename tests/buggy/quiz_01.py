"""Wrong answer sheets for the phase 01 quiz: each must lose its point."""

from grading.mutants import Mutant

MUTANTS = [
    Mutant(
        "seam_is_the_runner",
        "answers.py",
        '1: "C",',
        '1: "A",',
        "believes the model runner picks the blocks",
        caught_by="test_quiz.py::test_q01_the_seam",
    ),
    Mutant(
        "full_prompt_hit",
        "answers.py",
        '3: "C",',
        '3: "A",',
        "forgets that the last prompt token is always recomputed",
        caught_by="test_quiz.py::test_q03_a_fully_cached_prompt",
    ),
    Mutant(
        "preempt_by_swap",
        "answers.py",
        '4: "B",',
        '4: "A",',
        "thinks V1 swaps preempted KV to CPU",
        caught_by="test_quiz.py::test_q04_preemption",
    ),
    Mutant(
        "lowercase_blank",
        "answers.py",
        '10: "B",',
        '10: "",',
        "leaves a question unanswered",
        caught_by="test_quiz.py::test_q10_processes",
    ),
]
