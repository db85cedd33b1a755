"""The grader itself: the contract of DESIGN.md, on the real lab-01 suite."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.labs import LabNotFound, load_lab, normalize_lab_id
from tests.collected import collected_tests

REPO = Path(__file__).resolve().parent.parent


def run_grader(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grading", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=600,
    )


@pytest.mark.parametrize("name", ["lab-01", "lab01", "01", "1", "lab-01-block-allocator"])
def test_lab_ids_are_forgiving(name):
    assert normalize_lab_id(name) == "lab-01"


def test_unknown_lab_is_a_clear_error():
    with pytest.raises(LabNotFound, match="there is no lab-42"):
        load_lab("lab-42")


def test_stub_scores_zero_all_not_started(tmp_path):
    out = run_grader("lab-01", "--json", str(tmp_path / "results.json"))
    assert out.returncode == 0, out.stderr
    assert "NOT STARTED" in out.stdout and "Traceback" not in out.stdout + out.stderr
    total = load_total("lab-01")
    assert f"score: 0 / {total}" in out.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == 0
    assert all(t["score"] == 0 and t["output"].startswith("NOT STARTED") for t in data["tests"])


def load_total(lab: str) -> int:
    return sum(t.points for t in collected_tests(lab))


def test_solution_full_marks_and_valid_gradescope_json(tmp_path):
    path = tmp_path / "results.json"
    out = run_grader("lab-01", "--impl", "solutions/lab-01-block-allocator", "--json", str(path))
    assert out.returncode == 0, out.stderr
    data = json.loads(path.read_text())
    total = sum(t["max_score"] for t in data["tests"])
    assert data["score"] == total > 0
    for test in data["tests"]:
        assert set(test) >= {"name", "score", "max_score", "output", "visibility"}
        assert test["visibility"] in {"visible", "hidden", "after_due_date", "after_published"}
        assert isinstance(test["score"], int) and test["score"] == test["max_score"]
    assert f"score: {total} / {total}" in out.stdout


def test_every_graded_test_has_points_hint_and_doc():
    from grading.labs import available_labs

    for lab in available_labs():
        for info in collected_tests(lab.id):
            assert info.points > 0, info.nodeid
            assert len(info.hint) > 20, f"{info.nodeid}: the hint must teach something"
            assert ".md#" in info.doc, f"{info.nodeid}: the doc link needs a section anchor"


def test_unwritten_lab_says_so(monkeypatch):
    from grading import labs

    monkeypatch.setitem(labs.PLANNED_LABS, "lab-12", "future-lab")
    with pytest.raises(LabNotFound, match="lab-12 \\(future-lab\\) is not written yet"):
        load_lab("lab-12")


def test_missing_impl_folder_is_a_grader_error(tmp_path):
    out = run_grader("lab-01", "--impl", str(tmp_path / "nope"))
    assert out.returncode == 2 and "not a folder" in out.stderr


def test_missing_file_costs_points_not_the_grader(tmp_path):
    out = run_grader("lab-01", "--impl", str(tmp_path), "--quiet")
    assert out.returncode == 0
    assert out.stdout.startswith("score: 0 /")


def test_a_symbolic_link_is_refused_and_never_followed(tmp_path):
    """A link can name any file the grader (often root) reads, a solution included: the
    command line refuses it with a clear error, and staging never follows one."""
    from grading.runner import SuiteRunner

    lab = load_lab("lab-01")
    (tmp_path / "block_pool.py").symlink_to(lab.solution_dir / "block_pool.py")
    out = run_grader("lab-01", "--impl", str(tmp_path), "--quiet")
    assert out.returncode == 2 and "not a regular file" in out.stderr, out.stderr
    runner = SuiteRunner(lab, tmp_path)
    assert not (runner.staging.root / "impl" / "block_pool.py").exists()
    results = runner.run(runner.collect()[:3])
    assert sum(r.score for r in results) == 0, [(r.info.name, r.outcome) for r in results]


def test_syntax_error_reported_once_per_test_without_traceback(tmp_path):
    (tmp_path / "block_pool.py").write_text("def broken(:\n")
    out = run_grader("lab-01", "--impl", str(tmp_path))
    assert out.returncode == 0
    assert "SyntaxError" in out.stdout and "Traceback" not in out.stdout


def _lab_01_with_its_stub_in(tmp_path, monkeypatch):
    """lab-01 with its stub folder moved under ``tmp_path``: (lab, folder, the stub's path)."""
    from grading.labs import Lab

    lab = load_lab("lab-01")
    stub_dir = tmp_path / "labs" / lab.dirname
    stub_dir.mkdir(parents=True)
    fake = Lab(**{**lab.__dict__})
    monkeypatch.setattr(type(fake), "stub_dir", property(lambda self: stub_dir))
    return fake, stub_dir, stub_dir / "block_pool.py"


def test_reset_keeps_learner_edits_unless_forced(tmp_path, monkeypatch):
    from grading import stubs

    fake, stub_dir, target = _lab_01_with_its_stub_in(tmp_path, monkeypatch)
    assert stubs.reset_lab(fake) == 0 and target.exists(), "a missing stub is restored"
    target.write_text(target.read_text() + "\n# my work\n")
    assert stubs.reset_lab(fake) == 1
    assert target.read_text().endswith("# my work\n"), "an edited file is never overwritten"
    assert stubs.reset_lab(fake, force=True) == 0
    backups = list(stub_dir.glob("block_pool.py.bak-*"))
    assert len(backups) == 1 and backups[0].read_text().endswith("# my work\n")
    assert not target.read_text().endswith("# my work\n")


def test_regenerating_the_stubs_keeps_learner_edits_unless_forced(tmp_path, monkeypatch):
    """``python -m grading stubs`` (``make stubs``) rewrote every lab's file in ``labs/`` that
    differed from its stub, a learner's work included (backed up, but without ``--force``; a
    red-team helper). It now replaces only a stale stub still as committed, or with ``--force``."""
    import subprocess

    from grading import stubs

    fake, stub_dir, target = _lab_01_with_its_stub_in(tmp_path, monkeypatch)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    target.write_text("# a stale stub, as committed\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "stub"], check=True)
    assert stubs.check_or_write_stubs([fake], check=False) == 0, "a committed stale stub"
    assert "NotImplementedError" in target.read_text(), "is regenerated without --force"
    target.write_text(target.read_text() + "\n# my work\n")
    assert stubs.check_or_write_stubs([fake], check=False) == 1
    assert target.read_text().endswith("# my work\n"), "an edited file is never overwritten"
    assert stubs.check_or_write_stubs([fake], check=False, force=True) == 0
    backups = list(stub_dir.glob("block_pool.py.bak-*"))
    assert any(b.read_text().endswith("# my work\n") for b in backups)
    assert not target.read_text().endswith("# my work\n")


def test_the_judge_parses_through_the_thread_safe_helper():
    """``check_suites`` grades mutants in threads and staging parses every graded module; on
    CPython 3.11 two ``ast.parse`` at once can raise "AST constructor recursion depth
    mismatch" (gh-106905), which once failed CI. The judge's modules parse only through
    ``grading.sandbox.parse_python``, which serialises the parses."""
    import ast

    def is_ast_parse(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "parse"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "ast"
        )

    for name in ("sandbox.py", "runner.py", "check_suites.py", "report.py"):
        tree = ast.parse((Path(__file__).parents[1] / "grading" / name).read_text())
        callers = {
            function.name
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef)
            and any(is_ast_parse(node) for node in ast.walk(function))
        }
        assert callers <= {"parse_python"}, f"grading/{name}: {callers} call ast.parse directly"


def test_a_stub_ends_a_property_test_at_its_first_call():
    """The learner's NotImplementedError reaches the judge as ``LearnerNotStarted``, which no
    ``except Exception`` and no Hypothesis run catches: Hypothesis would take it for a failure
    and shrink it, calling the stub again and again (16 s of lab-10's 20 s timeout before)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from grading.remote import LearnerNotStarted

    calls = []

    @settings(max_examples=50, database=None, deadline=None)
    @given(st.integers())
    def property_test(x):
        calls.append(x)
        raise LearnerNotStarted("lab-10: OutputProcessor.add_request — track the request")

    with pytest.raises(LearnerNotStarted):
        property_test()
    assert len(calls) == 1, f"Hypothesis ran the stub {len(calls)} times"
    assert not issubclass(LearnerNotStarted, Exception)


def test_the_judges_temporary_files_go_with_the_grade(tmp_path):
    """A judge ends with ``os._exit`` (or is killed at a time limit), so a suite's
    ``TemporaryDirectory`` (lab-09's saved checkpoint) is never finalized: the judge's
    ``TMPDIR`` is a private folder of the grade's workdir, which the grade removes."""
    from grading.runner import SuiteRunner

    lab = load_lab("lab-01")
    runner = SuiteRunner(lab, lab.solution_dir)
    env = runner._env(learner_uid=300_000)
    judge_tmp = Path(env["TMPDIR"])
    assert judge_tmp.parent == runner.workdir and judge_tmp.stat().st_mode & 0o077 == 0
    seen = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(seen).parent == judge_tmp
    (result,) = runner.run([collected_tests("lab-01")[0]])
    assert result.outcome == "passed", result.message
    assert not Path(seen).exists() and not runner.workdir.exists()


def test_a_test_runs_under_its_own_time_limit(tmp_path):
    """``@graded(timeout=)`` reaches both the judge and the grader's watchdog through the
    collected ``TestInfo``: a hung call is stopped at the test's own limit (here cut to 0.5 s,
    against lab-01's 10 s). An explicit runner timeout (the hostile-submission tests') holds for
    every test."""
    import dataclasses

    from grading.runner import SuiteRunner

    lab = load_lab("lab-01")
    impl = tmp_path / lab.dirname
    impl.mkdir()
    source = (lab.solution_dir / "block_pool.py").read_text()
    hang = "\n\ndef _hang(self):\n    while True:\n        pass\n\n\nBlockPool.get_usage = _hang\n"
    (impl / "block_pool.py").write_text(source + hang)
    tests = {t.name: t for t in collected_tests("lab-01")}
    assert tests["random_allocations_and_frees_keep_the_invariants"].timeout, (
        "lab-01's random workload names its own, longer limit"
    )
    usage = dataclasses.replace(tests["usage"], timeout=0.5)
    (result,) = SuiteRunner(lab, impl).run([usage])
    assert result.outcome == "timeout", (result.outcome, result.message)
    # The test's duration (not the judge's and learner's start-up, slow on a busy machine).
    assert 0 < result.duration < lab.timeout, f"stopped after {result.duration} s, not at 0.5 s"
    assert SuiteRunner(lab, impl, timeout=3.0).test_timeout(usage) == 3.0
    assert SuiteRunner(lab, impl).test_timeout(tests["usage"]) == lab.timeout


def _defined_functions(source: str) -> dict[str, list]:
    """Qualified name -> body of every function a module defines (methods as Class.name)."""
    import ast

    found: dict[str, list] = {}

    def walk(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[f"{prefix}{node.name}"] = node.body

    walk(ast.parse(source).body, "")
    return found


def _raises_not_implemented(body: list) -> bool:
    import ast

    first = body[0]
    return (
        isinstance(first, ast.Raise)
        and isinstance(first.exc, ast.Call)
        and getattr(first.exc.func, "id", "") == "NotImplementedError"
    )


LAB_IDS = [f"lab-{n:02d}" for n in range(1, 12)]


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_the_learner_process_holds_no_other_implementation_of_a_task(lab_id, tmp_path):
    """The learner's ``mini_vllm`` is the import closure of its lab, with every task and every
    listed twin stubbed: no staged function of a task's name (another module's copy, as the
    engine keeps a torch twin of lab-06's numpy attention) can be re-exported for points."""
    from grading.sandbox import _imports, stage

    lab = load_lab(lab_id)
    staging = stage(lab, lab.stub_dir, parent=tmp_path)
    tasks = {q for tasks in lab.tasks.values() for q in tasks}
    lib = staging.root / "lib"
    for path in (lib / "mini_vllm").rglob("*.py"):  # learner_side.py calls the learner's
        for qualname, body in _defined_functions(path.read_text()).items():
            if qualname in tasks:
                assert _raises_not_implemented(body), (
                    f"{path.relative_to(lib)} holds a working {qualname}, a task of {lab_id}"
                )
    for module, twins in lab.twins.items():
        source = lib.joinpath(*module.split(".")).with_suffix(".py").read_text()
        functions = _defined_functions(source)
        assert all(_raises_not_implemented(functions[name]) for name in twins), module
    staged = {p.relative_to(lib).as_posix() for p in lib.rglob("*.py")}
    for filename in lab.files:  # what the stub imports, the learner's file can import
        for module in _imports((lab.stub_dir / filename).read_text()):
            path = module.replace(".", "/")
            assert {f"{path}.py", f"{path}/__init__.py"} & staged, f"{module} is not staged"
    assert "mini_vllm/llm.py" not in staged or lab_id == "lab-10", sorted(staged)
    if lab_id == "lab-06":  # the engine's torch attention: the same functions, another dtype
        assert not any(p.startswith("mini_vllm/attention/") for p in staged), sorted(staged)
    if lab_id == "lab-09":  # the engine's persistent batch flattens a step too
        assert "mini_vllm/worker/input_batch.py" not in staged, sorted(staged)
    staging.cleanup()


def test_only_a_calls_exception_keeps_its_builtin_type(tmp_path):
    """A refusal is graded by the builtin type of what a call raised (``pytest.raises``,
    ``except ValueError``). The same exception raised while the judge reads a learner object (an
    attribute, an item, a length, an iteration) arrives with no builtin type, so no region of
    any suite, however written, can take a read for the call's refusal; a write (a setter's
    refusal) answers as a call does, and ``hasattr`` still works, since ``getattr``'s
    ``AttributeError`` keeps its type."""
    from grading.remote import Connection, LearnerError, LearnerReadError
    from grading.sandbox import stage

    lab = load_lab("lab-01")
    submission = tmp_path / "submission"
    shutil.copytree(lab.solution_dir, submission)
    with (submission / "block_pool.py").open("a") as f:
        f.write(
            "\n\nclass Refusing(list):\n"
            "    @property\n"
            "    def blocks(self):\n"
            "        raise ValueError('refused when read')\n"
            "    @blocks.setter\n"
            "    def blocks(self, value):\n"
            "        raise RuntimeError('refused when set')\n"
            "    def __getitem__(self, key):\n"
            "        raise IndexError('refused when indexed')\n"
            "    def __len__(self):\n"
            "        raise ValueError('refused when measured')\n"
            "    def __iter__(self):\n"
            "        raise ValueError('refused when iterated')\n"
            "    def refuse(self):\n"
            "        raise ValueError('refused when called')\n"
        )
    staging = stage(lab, submission, parent=tmp_path)
    conn = Connection(staging)
    try:
        obj = conn.request("import", "block_pool").Refusing()
        for read in (lambda: obj.blocks, lambda: obj[0], lambda: len(obj), lambda: list(obj)):
            with pytest.raises(LearnerReadError) as raised:
                read()
            assert not isinstance(raised.value, ValueError | IndexError)
            assert raised.value.learner_type.endswith(("ValueError", "IndexError"))
        with pytest.raises(ValueError) as called:
            obj.refuse()
        assert isinstance(called.value, LearnerError) and called.value.request == "callmethod"
        with pytest.raises(RuntimeError):  # a setter refusing its value answers, as a call does
            obj.blocks = []
        assert not hasattr(obj, "no_such_attribute")
        with pytest.raises(TypeError, match="where a value was expected"):
            assert obj.refuse != 3  # a method where a value is expected is refused, as a Remote
    finally:
        conn.close()
        staging.cleanup()


def test_only_arrays_marked_writes_come_back_into_the_judges(tmp_path):
    """An in-place function's outputs are marked ``writes`` and come back into the judge's
    arrays; any other array the call changed fails it, and the judge's copy keeps what the
    judge put there, so an oracle that reads it later reads the judge's data."""
    import numpy as np

    from grading.remote import Connection, LearnerWroteAnInput, writes
    from grading.sandbox import stage

    lab = load_lab("lab-01")
    submission = tmp_path / "submission"
    shutil.copytree(lab.solution_dir, submission)
    with (submission / "block_pool.py").open("a") as f:
        f.write("\n\ndef scale_into(src, out):\n    out[:] = 2 * src\n    src[0] = -1\n")
    staging = stage(lab, submission, parent=tmp_path)
    conn = Connection(staging)
    try:
        module = conn.request("import", "block_pool")
        src, out = np.arange(3.0), np.zeros(3)
        with pytest.raises(LearnerWroteAnInput, match="argument 1"):
            module.scale_into(src, writes(out))
        assert src.tolist() == [0.0, 1.0, 2.0]  # the judge's input keeps its contents
        src, out = np.arange(3.0), np.zeros(3)
        module.scale_into(writes(src), writes(out))
        assert out.tolist() == [0.0, 2.0, 4.0] and src.tolist() == [-1.0, 1.0, 2.0]
    finally:
        conn.close()
        staging.cleanup()


def test_a_learner_exception_whose_constructor_wants_more_keeps_its_base():
    """A learner's ``UnicodeDecodeError`` (a ``ValueError`` whose constructor takes five
    arguments) reached the judge as a ``TypeError`` raised while rebuilding it, so an honest
    refusal failed a test's ``pytest.raises(ValueError)``; an ``ExceptionGroup`` likewise."""
    from grading.remote import LearnerError, _instantiate

    mro = ["UnicodeDecodeError", "UnicodeError", "ValueError", "Exception", "BaseException"]
    twin = _instantiate(mro, "'utf-8' codec can't decode byte 0xff")
    assert isinstance(twin, ValueError) and isinstance(twin, LearnerError)
    assert str(twin) == "'utf-8' codec can't decode byte 0xff"
    group = _instantiate(["ExceptionGroup", "BaseExceptionGroup", "Exception"], "two errors")
    assert isinstance(group, LearnerError) and str(group) == "two errors"
