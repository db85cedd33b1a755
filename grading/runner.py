"""Runs a lab's suite in judge processes and turns their reports into results.

Three kinds of process take part (docs/grader.md has the picture): this one, the grader,
which prints the table and writes results.json; the judge (``grading.child``), which runs the
pytest suite; and the learner process (``grading.learner_host``), sandboxed, which alone
imports the submitted code and answers the judge's requests with data. The grader reads
schema-checked lines from the judge on a private pipe, enforces a watchdog per test and a
budget per suite, and restarts a judge that died on the tests that remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grading import protocol
from grading.labs import REPO_ROOT, Lab, load_lab, order_key
from grading.protocol import TestInfo, TestResult
from grading.sandbox import LEARNER_UID_ENV, end_learners, new_learner_uid, stage
from grading.suite import IMPL_ENV

#: The judge's own output goes to a log file capped at this size.
MAX_LOG_BYTES = 8 * 1024 * 1024
PREFLIGHT_TIMEOUT = 60.0
COLLECT_TIMEOUT = 120.0
#: The judge enforces each test's time limit itself; the grader kills a judge that overruns
#: a test by more than this (a stuck judge, never a slow learner).
JUDGE_GRACE = 30.0
#: After "done", the judge has this long to exit before it is killed.
DONE_GRACE = 5.0


class GraderError(Exception):
    """The grader itself cannot run (a broken suite or environment, never the learner's code)."""


@dataclass
class ChildExit:
    events: list[dict[str, Any]]
    returncode: int | None
    timed_out_on: str | None
    log_tail: str


def _limit_child() -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_LOG_BYTES, MAX_LOG_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class SuiteRunner:
    """Grades one implementation folder against one lab's suite."""

    def __init__(
        self,
        lab: Lab,
        impl: Path,
        chain: list[tuple[Path, str, dict]] | None = None,
        timeout: float | None = None,
        on_result: Callable[[TestResult], None] | None = None,
        preflight_timeout: float = PREFLIGHT_TIMEOUT,
        fail_fast: bool = False,
        preflight: bool = True,
    ) -> None:
        self.lab = lab
        self.impl = impl.resolve()
        self.chain = chain or []
        self.timeout = timeout or lab.timeout
        # An explicit timeout holds for every test; otherwise a test's own (@graded(timeout=))
        # replaces the lab's.
        self.timeout_is_explicit = timeout is not None
        self.on_result = on_result
        self.preflight_timeout = preflight_timeout
        # Stop at the first test that does not pass (to tell whether a suite catches a bug,
        # one failure is enough); the tests not run then score nothing.
        self.fail_fast = fail_fast
        # The pre-import exists to report a broken module once; a folder known to import
        # (a mutant of the solution) can skip it.
        self.run_preflight = preflight
        self.workdir = Path(tempfile.mkdtemp(prefix="mini-vllm-grading-"))
        # Others may pass through (not list) it: a learner process that runs as another user
        # without a namespace reaches its staged folder by the path it is given.
        self.workdir.chmod(0o711)
        self.staging = stage(lab, self.impl, self.chain, parent=self.workdir)
        # The judge's own temporary files (a suite's checkpoints) live here, removed with the
        # workdir: a judge ends with os._exit, which skips the finalizers that would remove
        # them, and a judge stopped at a time limit never reaches them either.
        self.judge_tmp = self.workdir / "judge-tmp"
        self.judge_tmp.mkdir(mode=0o700)

    # -- one judge -------------------------------------------------------------------------
    def _env(self, learner_uid: int) -> dict[str, str]:
        env = dict(os.environ)
        env[LEARNER_UID_ENV] = str(learner_uid)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env[IMPL_ENV] = str(self.staging.root / "impl")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = str(self.judge_tmp)
        return env

    def _spawn(
        self,
        args: Sequence[str],
        per_test: Callable[[str], float] | None,
        overall: float,
        started: Callable[[str], None] | None = None,
    ) -> ChildExit:
        """Run one judge; stop it when a test outlives ``per_test(nodeid)`` or the judge
        ``overall``."""
        args = list(args)
        if self.lab.requires in ("torch", "model") and "--needs-torch" not in args:
            args.append("--needs-torch")  # a GPU is looked for; on one, no address-space cap
        read_fd, write_fd = os.pipe()
        log_path = self.workdir / f"judge-{secrets.token_hex(4)}.log"
        # The judge's learner processes run as this uid: whatever way the judge ends (a kill
        # at the budget included, which leaves it no chance to end them), they end after it.
        learner_uid = new_learner_uid()
        isolated = ["-P"] if sys.version_info >= (3, 11) else []
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    *isolated,
                    "-m",
                    "grading.child",
                    *args,
                    "--report-fd",
                    str(write_fd),
                    "--lab",
                    self.lab.id,
                    "--staging",
                    str(self.staging.root),
                    "--timeout",
                    str(self.timeout),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self._env(learner_uid),
                pass_fds=(write_fd,),
                preexec_fn=_limit_child,
            )
        os.close(write_fd)
        events: list[dict[str, Any]] = []
        buffer = b""
        current: str | None = None
        deadline_test = None
        deadline_all = time.monotonic() + overall
        deadline_done = None
        timed_out_on = None
        eof = False
        while not eof:
            now = time.monotonic()
            limits = [deadline_all] + [d for d in (deadline_test, deadline_done) if d]
            wait = min(limits) - now
            if wait <= 0:
                if deadline_done is None:
                    timed_out_on = current or "<between tests>"
                _kill_group(proc)
                break
            ready, _, _ = select.select([read_fd], [], [], wait)
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                eof = True
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > protocol.MAX_LINE:
                buffer = b""
            for line in lines:
                event = protocol.decode(line)
                if event is None:
                    continue
                events.append(event)
                if event["event"] == "start":
                    current = event["nodeid"]
                    deadline_test = (
                        time.monotonic() + per_test(current) + JUDGE_GRACE if per_test else None
                    )
                    if started:
                        started(current)
                elif event["event"] == "result":
                    current, deadline_test = None, None
                elif event["event"] == "done":
                    deadline_done = time.monotonic() + DONE_GRACE
        os.close(read_fd)
        if timed_out_on is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=DONE_GRACE)
            _kill_group(proc)
        end_learners(learner_uid)
        tail = _tail(log_path)
        log_path.unlink(missing_ok=True)
        return ChildExit(events, proc.returncode, timed_out_on, tail)

    # -- the three phases ------------------------------------------------------------------
    def collect(self) -> list[TestInfo]:
        args = ["collect", "--suite", str(self.lab.suite_dir)]
        if self.lab.requires in ("torch", "model"):
            args.append("--needs-torch")
        out = self._spawn(args, None, COLLECT_TIMEOUT)
        collected = [e for e in out.events if e["event"] == "collected"]
        if not collected:
            raise GraderError(f"could not collect the suite {self.lab.suite_dir}:\n{out.log_tail}")
        event = collected[0]
        if event["errors"]:
            raise GraderError(
                "the suite itself does not import (a bug in the course, not in "
                "your code):\n" + "\n".join(map(str, event["errors"]))[:4000]
            )
        if event["ungraded"]:
            raise GraderError(f"tests without a @graded marker: {event['ungraded']}")
        keys = TestInfo.__dataclass_fields__
        tests = [TestInfo(**{k: v for k, v in t.items() if k in keys}) for t in event["tests"]]
        # The guide's order (lab.json's "order"; sorted() is stable): the test of what is
        # written first runs and prints first, so a cascade shows its cause at the top.
        return sorted(tests, key=lambda t: order_key(self.lab, t.nodeid))

    def preflight(self) -> tuple[str, str]:
        modules = [f.removesuffix(".py") for f in self.lab.files]
        out = self._spawn(
            ["preflight", "--suite", str(self.lab.suite_dir), "--modules", *modules],
            None,
            self.preflight_timeout,
        )
        for event in out.events:
            if event["event"] == "preflight":
                return event["status"], event["message"]
        if out.timed_out_on:
            return "timeout", f"importing your code did not finish in {self.preflight_timeout:g} s"
        return "crashed", f"importing your code killed the process ({_exit_text(out.returncode)})"

    def run(self, tests: list[TestInfo]) -> list[TestResult]:
        try:
            return self._run(tests)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "workdir", "/nonexistent-mini-vllm"), ignore_errors=True)

    def test_timeout(self, info: TestInfo) -> float:
        """Seconds ``info``'s test may run before it is stopped and scored TIMEOUT."""
        return self.timeout if self.timeout_is_explicit else info.time_limit(self.timeout)

    def _run(self, tests: list[TestInfo]) -> list[TestResult]:
        by_id = {t.nodeid: t for t in tests}
        limits = {t.nodeid: self.test_timeout(t) for t in tests}
        results: dict[str, TestResult] = {}

        def record(result: TestResult) -> None:
            results[result.info.nodeid] = result
            if self.on_result:
                self.on_result(result)

        status, message = self.preflight() if self.run_preflight else ("ok", "")
        if status != "ok":
            outcome = {
                "not_started": "not_started",
                "timeout": "timeout",
                "crashed": "crashed",
            }.get(status, "error")
            for info in tests:
                record(TestResult(info, outcome, message))
            return [results[t.nodeid] for t in tests]

        budget_end = time.monotonic() + self.lab.budget
        while True:
            remaining = [t for t in tests if t.nodeid not in results]
            if not remaining:
                break
            if self.fail_fast and any(r.outcome != "passed" for r in results.values()):
                for info in remaining:
                    record(TestResult(info, "skipped", "not run: stopped at the first failure"))
                break
            left = budget_end - time.monotonic()
            if left <= 0:
                for info in remaining:
                    record(
                        TestResult(
                            info,
                            "timeout",
                            "not run: the suite's time budget was "
                            "spent (earlier tests hung or were slow)",
                        )
                    )
                break
            list_file = self.workdir / "tests.json"
            list_file.write_text(json.dumps({t.nodeid: limits[t.nodeid] for t in remaining}))
            args = ["run", "--suite", str(self.lab.suite_dir), "--tests", str(list_file)]
            if self.fail_fast:
                args.append("--exitfirst")
            out = self._spawn(args, lambda nodeid: limits.get(nodeid, self.timeout), left)
            for event in out.events:
                nodeid = event.get("nodeid")
                if event["event"] == "result" and nodeid in by_id and nodeid not in results:
                    record(
                        TestResult(
                            by_id[nodeid],
                            event["outcome"],
                            event.get("message", ""),
                            float(event.get("duration", 0.0)),
                        )
                    )
            if out.timed_out_on in by_id and out.timed_out_on not in results:
                record(
                    TestResult(
                        by_id[out.timed_out_on],
                        "timeout",
                        f"did not finish in {limits[out.timed_out_on]:g} s: an infinite loop, or "
                        "an operation that is not O(1)?",
                    )
                )
                continue
            if any(e["event"] == "done" for e in out.events):
                if self.fail_fast:
                    continue  # the loop head records what --exitfirst left unrun
                # pytest finished but skipped reporting some ids (deselected by a bad id).
                for info in [t for t in tests if t.nodeid not in results]:
                    record(TestResult(info, "error", "the test did not run"))
                break
            started = [e["nodeid"] for e in out.events if e["event"] == "start"]
            victim = next((n for n in reversed(started) if n not in results), None)
            if victim is None:
                # Died between tests: the first one not run is charged (it would have crashed
                # the same way, and it bounds the restarts). With every test recorded (a judge
                # killed after its last result), nothing is.
                victim = next((t.nodeid for t in tests if t.nodeid not in results), None)
                if victim is None:
                    break
            tail = protocol.clip(out.log_tail, 600)
            record(
                TestResult(
                    by_id[victim],
                    "crashed",
                    f"the test process died ({_exit_text(out.returncode)})"
                    + (f"; last output:\n{tail}" if tail else ""),
                )
            )
        return [results[t.nodeid] for t in tests]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def unfinished_tasks(lab: Lab, folder: Path, filename: str) -> list[str]:
    """The tasks of ``lab`` in ``folder/filename`` that still raise ``NotImplementedError``.

    Read from the file's syntax tree (the grader never imports learner code): a task is
    unfinished when its function is missing or its body (after the docstring) starts with
    ``raise NotImplementedError``, as the stub's does. A file that does not parse, or is not a
    regular file of a sensible size (a link, a FIFO, a device: never read), counts as unfinished
    as a whole.
    """
    import ast

    from grading.sandbox import parse_python, read_regular_file
    from grading.stubs import StubError, _find_function

    text = read_regular_file(folder / filename)
    if text is None:
        return ["(not a regular file of at most 4 MiB)"]
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ["(the file does not parse)"]
    unfinished = []
    for qualname in lab.tasks.get(filename, {}):
        try:
            body = _find_function(tree, qualname).body
        except StubError:
            unfinished.append(qualname)
            continue
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        first = body[0] if body else None
        if isinstance(first, ast.Raise) and first.exc is not None:
            target = first.exc.func if isinstance(first.exc, ast.Call) else first.exc
            if isinstance(target, ast.Name) and target.id == "NotImplementedError":
                unfinished.append(qualname)
    return unfinished


def plan_chain(lab: Lab) -> tuple[list[tuple[Path, str, dict]], list[str]]:
    """The learner's earlier labs that provide symbols, in course order, for ``--chain``, and
    a note for each earlier file left out.

    An earlier lab's file is used only when all of its tasks are written: a file with a task
    still raising ``NotImplementedError`` would make every test of this lab fail on it (all
    rows NOT STARTED, each blaming the earlier lab). That file is left out, so the reference
    stands in for it, and the note says so before the table.
    """
    from grading.labs import available_labs

    chain, notes = [], []
    supplied: dict[str, str] = {}  # symbol -> the earlier lab whose file supplies it
    for earlier in available_labs():
        if earlier.kind != "lab" or earlier.number >= lab.number:
            continue
        for filename, provides in earlier.provides.items():
            if not os.path.lexists(earlier.stub_dir / filename):
                continue
            todo = unfinished_tasks(earlier, earlier.stub_dir, filename)
            if todo:
                shown = ", ".join(todo[:3]) + (
                    f" and {len(todo) - 3} more" if len(todo) > 3 else ""
                )
                state = (
                    "NOT STARTED"
                    if len(todo) == len(earlier.tasks.get(filename, {}))
                    else "unfinished"
                )
                notes.append(
                    f"--chain: {earlier.id} is {state} in labs/{earlier.dirname}/"
                    f"{filename} ({shown}): {lab.id} uses the reference for it instead"
                )
                continue
            chain.append((earlier.stub_dir, filename, provides))
            symbols = [s for names in provides.values() for s in names]
            replaced = sorted({supplied[s] for s in symbols if s in supplied})
            for other in replaced:
                shared = [s for s in symbols if supplied.get(s) == other]
                notes.append(
                    f"--chain: {earlier.id}'s {filename} also holds {', '.join(shared)}; "
                    f"{lab.id} uses {earlier.id}'s, not {other}'s"
                )
            supplied.update(dict.fromkeys(symbols, earlier.id))
    return chain, notes


def chain_for(lab: Lab) -> list[tuple[Path, str, dict]]:
    """The earlier labs ``--chain`` grades with (:func:`plan_chain`, without its notes)."""
    return plan_chain(lab)[0]


def grade(
    lab_name: str,
    impl: Path | None = None,
    *,
    chain: bool = False,
    on_result: Callable[[TestResult], None] | None = None,
    notes: list[str] | None = None,
) -> tuple[Lab, list[TestResult]]:
    """Grade ``impl`` (default: the lab's folder in ``labs/``). With ``chain``, the learner's
    finished earlier labs stand in for the reference; ``notes`` receives what the learner
    should know first (an earlier lab left out of the chain)."""
    lab = load_lab(lab_name)
    folder = impl or lab.stub_dir
    if not folder.is_dir():
        raise GraderError(f"{folder} is not a folder holding {', '.join(lab.files)}")
    for filename in lab.files:
        path = folder / filename
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise GraderError(
                f"{path} is not a regular file (a symbolic link, a folder or a device): the "
                "grader reads only the file itself; replace it with a copy of the file to grade"
            )
    chained, chain_notes = plan_chain(lab) if chain else (None, [])
    if notes is not None:
        notes.extend(chain_notes)
    runner = SuiteRunner(lab, folder, chained, on_result=on_result)
    tests = runner.collect()
    return lab, runner.run(tests)
