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
        "slot_through_the_wrong_table_entry",
        "answers.py",
        '6: "D",',
        '6: "B",',
        "takes block 7 (the table's first entry) for position 20: 7 * 16 + 4 = 116, instead "
        "of logical block 20 // 16 = 1, block 3",
        caught_by="test_quiz.py::test_q06_where_does_it_go",
    ),
    Mutant(
        "blocks_freed_front_first",
        "answers.py",
        '8: "B",',
        '8: "A",',
        "believes a finished request's blocks go back in table order, not tail first",
        caught_by="test_quiz.py::test_q08_the_order_blocks_come_back",
    ),
    Mutant(
        "question_numbers_as_strings",
        "answers.py",
        '1: "C",',
        '"1": "C",',
        "writes the question number as a string key: ANSWERS[1] does not exist",
        caught_by="test_quiz.py::test_q01_the_seam",
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
