"""The mini-vLLM grader: runs a lab's graded suite against any implementation folder.

The learner's code only ever runs in child processes (``grading.child``); this process
collects the tests, watches the children with per-test timeouts, and computes the score
from what they report, so nothing the graded code does (loop, crash, exit, output flood,
patching pytest) can crash the grader or forge a score. See ``docs/grader.md``.
"""
