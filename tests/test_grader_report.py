"""What the learner reads: messages without pytest's noise, compact Hypothesis steps, the test
order, the "fix first" line, the plain layout, and --chain's fallback. Fast: no grading runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grading import report
from grading.labs import Lab, load_lab, order_key
from grading.messages import clean_assertion, compact_steps, first_failure, short_reprs, steps_block
from grading.protocol import TestInfo, TestResult
from grading.runner import plan_chain, unfinished_tasks

BLOCK = (
    "KVCacheBlock(block_id=0, ref_cnt=0, _block_hash=None, prev_free_block=-1, "
    "next_free_block=1, is_null=False)"
)


def test_a_message_of_the_test_replaces_pytests_explanation():
    raw = (
        f"I2: a popped block must not keep links into the queue\nassert ({BLOCK} is None)\n"
        f" +  where {BLOCK} = x.prev_free_block"
    )
    assert clean_assertion(raw) == "I2: a popped block must not keep links into the queue"


def test_a_bare_assert_says_what_was_compared():
    raw = (
        "assert set() == {'a', 'c'}\n  Extra items in the right set:\n  'a'\n  'c'\n"
        "  Use -v to get more diff"
    )
    text = clean_assertion(raw, "assert seen_keys == {'a', 'c'}")
    assert text.startswith("check failed: seen_keys == {'a', 'c'}\nassert set() == {'a', 'c'}")
    assert "Use -v" not in text and "where" not in text


def test_block_reprs_are_short():
    other = BLOCK.replace("block_id=0", "block_id=-1")
    assert short_reprs(f"{BLOCK} is {other}") == "<block 0 ref_cnt=0> is <sentinel>"
    cached = BLOCK.replace("_block_hash=None", "_block_hash=b'h'")
    assert short_reprs(cached) == "<block 0 ref_cnt=0 cached>"


def test_state_machine_notes_become_one_step_a_line():
    notes = [
        "Failing test case: <state machine>",
        "state = PoolMachine()",
        "Draw 1 (n): 1  # or any other generated value",
        "state.allocate(data=data(...))",
        "state.popleft()",
        "Draw 2 (block): 3",
        "state.remove(data=data(...))",
        "state.teardown()",
        "Explanation:",
        "    These lines were always and only run",
        "        /repo/tests/labs/lab_01/test_free_queue.py:99",
    ]
    assert compact_steps(notes) == ["allocate(n=1)", "popleft()", "remove(block=3)"]


def test_a_given_example_is_one_line():
    notes = [
        "Falsifying example: test_scatter(\n    case=(2, 2, [0, 1]),\n)",
        "Explanation:\n    These lines were always and only run by failing test cases:\n"
        "        /repo/tests/labs/lab_06/test_cache_write.py:110",
    ]
    exc = AssertionError("wrong row")
    exc.__notes__ = notes
    assert steps_block(exc, 0) == "failing example: case=(2, 2, [0, 1])"
    exc.__notes__ = [
        "Failing test case: test_x(\n    # The test always failed when commented "
        "parts were varied together.\n    case=(\n        2,\n        [],  # or any "
        "other generated value\n    ),\n)"
    ]  # Hypothesis >= 6.1xx
    assert steps_block(exc, 0) == "failing example: case=(2, [])"


def test_the_first_of_several_hypothesis_failures_is_shown():
    first, second = AssertionError("I1 broke"), ValueError("boom")
    first.__notes__ = ["state = M()", "Draw 1 (n): 2", "state.allocate(data=data(...))"]
    try:
        from builtins import ExceptionGroup  # Python >= 3.11
    except ImportError:  # 3.10: Hypothesis raises the backport's
        from exceptiongroup import ExceptionGroup
    group = ExceptionGroup("Hypothesis found 2 distinct failures.", [first, second])
    shown, others = first_failure(group)
    assert shown is first and others == 1
    block = steps_block(shown, others)
    assert "1 other distinct failure" in block and "1. allocate(n=2)" in block


def _result(name: str, outcome: str, message: str = "", nodeid: str | None = None) -> TestResult:
    info = TestInfo(
        nodeid or f"tests/labs/lab_01/test_x.py::test_{name}",
        name,
        2,
        "I2: the hint",
        "phases/02-paged-attention/README.md#the-free-block-queue",
    )
    return TestResult(info, outcome, message)


def test_cascade_names_the_earliest_failing_test():
    rows = [
        _result("queue_ok", "passed"),
        _result("popleft", "failed", "I2: links kept"),
        *[
            _result(f"pool_{i}", "failed", f"RuntimeError: block {i} is already in it")
            for i in range(3)
        ],
    ]
    line = report.cascade_line(rows)
    assert line and line.startswith("fix first: popleft ") and "3 rows fail the same way" in line
    assert report.cascade_line(rows[:3]) is None, "two different failures are no cascade"


def test_a_long_message_keeps_its_end_hint_and_link():
    message = "\n".join(f"line {i}" for i in range(30))
    text = report.shown_text(_result("x", "failed", message), verbose=False)
    lines = text.splitlines()
    assert lines[0] == "line 0" and "line 29" in lines and "line 15" not in lines
    assert lines[-2].startswith("hint: ") and lines[-1].startswith("read: ")


def test_plain_layout_never_breaks_a_read_path(capsys):
    lab = load_lab("lab-01")
    rows = [_result("a_test_with_a_long_name", "failed", "word " * 60)]
    report.print_plain(lab, rows, width=60)
    out = capsys.readouterr().out
    assert "    read: phases/02-paged-attention/README.md#the-free-block-queue\n" in out
    assert all(len(line) <= 60 for line in out.splitlines() if "read:" not in line)
    assert out.rstrip().endswith("score: 0 / 2")


FORGED = "\x1b[2J\x1b[H27 passed\r\x9b1;1r\x1b[6nscore: 59 / 59\x07"


def test_plain_layout_shows_control_characters_instead_of_obeying_them(capsys):
    report.print_plain(load_lab("lab-01"), [_result("x", "failed", "\x1b[2J[bold]no[/]")])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J[bold]no[/]" in out


def test_the_table_shows_control_characters_instead_of_obeying_them(monkeypatch):
    """The table layout (a wide terminal) prints through rich, which emits escape codes of its
    own for colours: a message's must arrive written out, in every row and in "fix first"."""
    import io
    import os
    import sys

    from rich.console import Console

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(
        report.shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((200, 24))
    )
    monkeypatch.delenv("MINI_VLLM_PLAIN", raising=False)
    buffer = io.StringIO()
    monkeypatch.setattr(
        "rich.console.Console",
        lambda **kw: Console(**{**kw, "file": buffer, "force_terminal": True}),
    )
    rows = [_result(f"t{i}", "failed", FORGED) for i in range(3)]
    assert all("\x1b" not in r.message and "\x9b" not in r.message for r in rows)
    report.print_table(load_lab("lab-01"), rows)
    out = buffer.getvalue()
    assert "fix first" in out and out.count("\\x1b[2J") >= 4, out
    for obeyed in ("\x1b[2J", "\x1b[H", "\x9b", "\x1b[6n", "\x07", "\r"):
        assert obeyed not in out, f"{obeyed!r} reached the terminal"


def test_tests_follow_the_guides_order():
    lab = load_lab("lab-01")
    pool = "tests/labs/lab_01/test_block_pool.py::test_usage"
    queue = "tests/labs/lab_01/test_free_queue.py::test_empty_queue"
    assert order_key(lab, queue) < order_key(lab, pool)
    nameless = Lab(**{**lab.__dict__, "order": ("test_block_pool.py::test_usage",)})
    assert order_key(nameless, pool) == 0 and order_key(nameless, queue) == 1


def test_unfinished_tasks_are_read_from_the_file(tmp_path: Path):
    lab = load_lab("lab-01")
    stub = (lab.stub_dir / "block_pool.py").read_text()
    todo = unfinished_tasks(lab, lab.stub_dir, "block_pool.py")
    assert todo == list(lab.tasks["block_pool.py"]), "the stub: every task NOT STARTED"
    assert unfinished_tasks(lab, lab.solution_dir, "block_pool.py") == []
    (tmp_path / "block_pool.py").write_text("def broken(:\n")
    assert unfinished_tasks(lab, tmp_path, "block_pool.py") == ["(the file does not parse)"]
    assert "raise NotImplementedError" in stub


def test_a_hostile_earlier_lab_file_is_left_out_of_the_chain(tmp_path: Path):
    """--chain reads the learner's earlier files before any watchdog runs (a red-team helper):
    a FIFO blocked the grader for ever, a link was read through, and a file that breaks the
    parser's recursion crashed it. Each is now an unfinished file, left out with a note."""
    lab = load_lab("lab-01")
    not_regular = ["(not a regular file of at most 4 MiB)"]
    os.mkfifo(tmp_path / "block_pool.py")
    assert unfinished_tasks(lab, tmp_path, "block_pool.py") == not_regular
    (tmp_path / "block_pool.py").unlink()
    (tmp_path / "block_pool.py").symlink_to(lab.solution_dir / "block_pool.py")
    assert unfinished_tasks(lab, tmp_path, "block_pool.py") == not_regular
    (tmp_path / "block_pool.py").unlink()
    (tmp_path / "block_pool.py").write_text("x = y" + ".a" * 1_000_000 + "\n")
    assert unfinished_tasks(lab, tmp_path, "block_pool.py") == ["(the file does not parse)"]


def test_chain_leaves_out_unfinished_earlier_labs(monkeypatch, tmp_path: Path):
    lab = load_lab("lab-07")
    chain, notes = plan_chain(lab)
    untouched = {n.split()[1] for n in notes}
    chained = {Path(folder).name for folder, _, _ in chain}
    for earlier in ("lab-01", "lab-05"):
        finished = not unfinished_tasks(
            load_lab(earlier), load_lab(earlier).stub_dir, "block_pool.py"
        )
        assert (earlier in untouched) != finished
        assert (load_lab(earlier).dirname in chained) == finished
    assert all("uses the reference for it instead" in n for n in notes)


@pytest.mark.parametrize("columns, plain", [(80, True), (99, True), (200, False)])
def test_narrow_terminals_get_the_plain_layout(monkeypatch, columns, plain):
    import os
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(
        report.shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((columns, 24))
    )
    monkeypatch.delenv("MINI_VLLM_PLAIN", raising=False)
    rows = [_result("x", "failed", "m")]
    assert (report._layout_width(rows) is None) == plain


def test_chain_says_which_earlier_lab_supplies_a_shared_class(monkeypatch):
    """lab-05's file holds lab-01's classes too (given there): with both labs finished, the
    chain grades with lab-05's, and says that lab-01's are not the ones in use."""
    import grading.runner

    monkeypatch.setattr(grading.runner, "unfinished_tasks", lambda *_: [])
    chain, notes = plan_chain(load_lab("lab-07"))
    chained = [Path(folder).name for folder, _, _ in chain]
    assert {load_lab("lab-01").dirname, load_lab("lab-05").dirname} <= set(chained)
    assert any(
        "lab-05's block_pool.py also holds" in n and "not lab-01's" in n and "BlockPool" in n
        for n in notes
    ), notes


def test_a_message_cannot_pose_as_the_verdict_in_results_json(tmp_path: Path):
    """A learner's exception message is quoted in ``results.json``: 30 blank lines then
    "PASSED" and "score: 59 / 59" at the margin passed for the grader's verdict in Gradescope's
    box (a red-team helper). Every line of the message is indented; the grader's own lines
    (the verdict, first and last, the hint, the link) alone start at the margin."""
    import json

    fake = "RuntimeError: " + "\n" * 30 + "PASSED\nlab-01: 59 / 59\nscore: 59 / 59" + "\n" * 30
    results = [_result(name, name, fake) for name in ("failed", "passed", "not_started")]
    path = tmp_path / "results.json"
    report.write_results_json(load_lab("lab-01"), results, path)
    tests = json.loads(path.read_text())["tests"]
    failed, passed, not_started = (t["output"].splitlines() for t in tests)
    assert passed == ["PASS"]
    assert failed[0] == "FAIL" and failed[-1] == "FAIL: 0 / 2", failed
    assert not_started[0] == "NOT STARTED" and not_started[-1] == "NOT STARTED: 0 / 2"
    for lines in (failed, not_started):
        margin = [line for line in lines if line and not line.startswith("    ")]
        assert margin == [lines[0], lines[-3], lines[-2], lines[-1]], margin
        assert lines[-3].startswith("hint: ") and lines[-2].startswith("read: ")


def test_the_rerun_command_is_one_the_learner_can_type(monkeypatch, tmp_path: Path) -> None:
    """Under ``make lab-NN`` the hint names the make target; run directly, the interpreter that
    runs the grader (a bare ``python`` may lack its dependencies), relative to the checkout."""
    monkeypatch.setenv("MAKELEVEL", "1")
    assert report.rerun_command("lab-01", "--verbose") == "make lab-01 LAB_FLAGS=--verbose"
    monkeypatch.delenv("MAKELEVEL")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    monkeypatch.setattr(report.sys, "executable", str(venv_python))
    monkeypatch.chdir(tmp_path)
    assert report.rerun_command("lab-01", "-v") == ".venv/bin/python -m grading lab-01 -v"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert report.rerun_command("lab-01", "-v") == f"{venv_python} -m grading lab-01 -v"
