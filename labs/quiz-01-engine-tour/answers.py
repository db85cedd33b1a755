# quiz-01: write the letter (A, B, C or D) of your answer to each question of
# phases/01-engine-tour/QUIZ.md. Grade yourself: make quiz-01
"""Your answers to the phase 01 self-check quiz."""

ANSWERS: dict[int, str] = {
    1: "",  # the seam
    2: "",  # out of blocks
    3: "",  # a fully cached prompt
    4: "",  # preemption
    5: "",  # ahead of time
    6: "",  # where does it go?
    7: "",  # stop strings
    8: "",  # the order blocks come back
    9: "",  # when a block becomes a hit
    10: "",  # processes
}
