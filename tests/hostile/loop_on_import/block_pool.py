"""Hangs at import time: the grader's pre-import must time out once, not once per test."""
while True:
    pass
