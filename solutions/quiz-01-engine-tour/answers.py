# quiz-01: write the letter (A, B, C or D) of your answer to each question of
# phases/01-engine-tour/QUIZ.md. Grade yourself: make quiz-01
"""Your answers to the phase 01 self-check quiz."""

ANSWERS: dict[int, str] = {
    1: "C",  # the seam
    2: "B",  # out of blocks
    3: "C",  # a fully cached prompt
    4: "B",  # preemption
    5: "B",  # ahead of time
    6: "D",  # where does it go?
    7: "B",  # stop strings
    8: "B",  # the order blocks come back
    9: "B",  # when a block becomes a hit
    10: "B",  # processes
}
