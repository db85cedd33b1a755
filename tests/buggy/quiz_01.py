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
    Mutant(
        "partial_allocation",
        "answers.py",
        '2: "B",',
        '2: "A",',
        "believes allocate_slots hands out the free blocks it has and shortens the step, "
        "where allocation is all or nothing and None sends the scheduler to preempt",
        caught_by="test_quiz.py::test_q02_out_of_blocks",
    ),
    Mutant(
        "advanced_early_to_release_the_budget",
        "answers.py",
        '5: "B",',
        '5: "A",',
        "thinks num_computed_tokens moves ahead of the forward pass to give the budget back, "
        "not so that the next schedule() can plan a chunked prompt's next chunk",
        caught_by="test_quiz.py::test_q05_ahead_of_time",
    ),
    Mutant(
        "stop_strings_in_check_stop",
        "answers.py",
        '7: "B",',
        '7: "A",',
        "looks for stop strings in the scheduler's check_stop, which sees token ids only",
        caught_by="test_quiz.py::test_q07_stop_strings",
    ),
    Mutant(
        "hit_after_the_forward_pass",
        "answers.py",
        '9: "B",',
        '9: "C",',
        "believes a block becomes a hit once the runner reports it written, where "
        "allocate_slots publishes it before the forward pass",
        caught_by="test_quiz.py::test_q09_when_a_block_becomes_a_hit",
    ),
    Mutant(
        "letter_in_parentheses",
        "answers.py",
        '1: "C",',
        '1: "(C)",',
        "copies the option with its punctuation: the answer is the letter alone",
        caught_by="test_quiz.py::test_q01_the_seam",
    ),
]
