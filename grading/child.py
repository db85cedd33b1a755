"""The judge: collects, pre-imports or runs a lab's suite and reports to the grader.

Run as ``python -P -m grading.child MODE --suite DIR --report-fd N --staging DIR [--tests FILE]``.
MODE is ``collect`` (list the graded tests; no graded code runs), ``preflight`` (import the
graded modules once, so a broken file is reported once instead of once per test) or ``run``
(run the listed tests, reporting each as it ends).

The judge runs the tests, and so decides every outcome, but never imports learner code: the
tests reach it through proxies to a separate, sandboxed learner process (``grading/remote.py``,
``grading/sandbox.py``). Nothing the learner process does can reach this process's memory, its
report pipe or its files; it can only send data, which the tests judge.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import ctypes
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from grading import protocol
from grading.labs import load_lab
from grading.messages import (
    clean_assertion,
    exception_only,
    first_failure,
    short_reprs,
    steps_block,
)
from grading.remote import LearnerError, LearnerFault, LearnerNotStarted
from grading.sandbox import Staging
from grading.suite import IMPL_ENV, SESSION, load_impl

PR_SET_DUMPABLE = 4
#: A message's length limit: enough for a message and a dozen shrunk steps.
MAX_MESSAGE = 2500


def harden_process() -> None:
    """No core dumps, no ptrace and no /proc/PID/fd access for processes of the same user."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class Channel:
    """Writes JSON events to the grader on a private pipe that only this process holds."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def send(self, event: str, **fields: Any) -> None:
        data = protocol.encode(event, **fields)
        while data:
            data = data[os.write(self._fd, data) :]


def _graded_marker(item: pytest.Item) -> dict[str, Any] | None:
    marker = item.get_closest_marker("graded")
    return dict(marker.kwargs) if marker else None


def _statement(exc: BaseException) -> str | None:
    """The source of the statement that raised ``exc`` (a failed ``assert`` in the suite)."""
    try:
        entry = pytest.ExceptionInfo.from_exception(exc).traceback[-1]
        return str(entry.statement)
    except Exception:  # no traceback, no source: the message alone must do
        return None


def _did_not_raise(exc: BaseException) -> str | None:
    """pytest.raises' "DID NOT RAISE <class 'ValueError'>" in the learner's terms."""
    text = str(exc)
    if type(exc).__name__ != "Failed" or not text.startswith("DID NOT RAISE"):
        return None
    names = re.findall(r"(?:<class ')?(?:\w+\.)*(\w+(?:Error|Exception|Warning))", text)
    wanted = " or ".join(dict.fromkeys(names)) or "an exception"
    return f"your code returned normally where it must raise {wanted}"


def _describe(exc: BaseException) -> str:
    """One readable paragraph: what the test says broke and, for the learner's exception,
    where it was raised; for a Hypothesis failure, the first one and its shortest steps
    (``grading/messages.py`` says what noise is left out and why)."""
    shown, others = first_failure(exc)
    if isinstance(shown, LearnerError):
        text = getattr(shown, "display", str(shown))
    elif isinstance(shown, LearnerFault):
        text = str(shown)
    elif isinstance(shown, AssertionError):
        text = clean_assertion(str(shown), _statement(shown)) or "AssertionError"
    else:
        text = _did_not_raise(shown) or exception_only(shown)
    steps = steps_block(shown, others)
    return protocol.clip(short_reprs(text) + (f"\n{steps}" if steps else ""), MAX_MESSAGE)


class Reporter:
    """A pytest plugin that turns each test's phases into one outcome for the parent."""

    def __init__(self, channel: Channel, timeouts: dict[str, float], default: float) -> None:
        self.channel = channel
        self.timeouts = timeouts
        self.default_timeout = default
        self._outcome: dict[str, tuple[str, str]] = {}
        self._started: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = (yield).get_result()
        if call.excinfo is None or report.passed:
            return
        exc, _ = first_failure(call.excinfo.value)
        if report.skipped:
            self._record(item.nodeid, "skipped", str(getattr(exc, "msg", exc)))
        elif isinstance(exc, LearnerFault):
            self._record(item.nodeid, exc.outcome, _describe(exc))
        elif isinstance(exc, NotImplementedError | LearnerNotStarted):
            self._record(item.nodeid, "not_started", protocol.clip(str(exc)))
        else:
            outcome = "failed" if call.when == "call" else "error"
            self._record(item.nodeid, outcome, _describe(call.excinfo.value))

    def _record(self, nodeid: str, outcome: str, message: str) -> None:
        if nodeid not in self._outcome:  # the first failing phase tells the story
            self._outcome[nodeid] = (outcome, message)

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int, str]) -> None:
        self._started[nodeid] = time.perf_counter()
        SESSION.deadline = time.monotonic() + self.timeouts.get(nodeid, self.default_timeout)
        self.channel.send("start", nodeid=nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int, str]) -> None:
        outcome, message = self._outcome.get(nodeid, ("passed", ""))
        # A stub's NotImplementedError leaves the learner process as sound as a pass does.
        SESSION.end_test(passed=outcome in ("passed", "not_started"))
        duration = time.perf_counter() - self._started.get(nodeid, time.perf_counter())
        self.channel.send(
            "result", nodeid=nodeid, outcome=outcome, message=message, duration=round(duration, 3)
        )


class Collector:
    """A pytest plugin that lists graded tests without running any of them."""

    def __init__(self, channel: Channel, has_gpu: bool) -> None:
        self.channel = channel
        self.has_gpu = has_gpu
        self.errors: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a suite module that does not import: the suite's bug, never graded
            self.errors.append(protocol.clip(f"{report.nodeid}: {report.longreprtext}", 3000))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        tests, ungraded = [], []
        for item in session.items:
            meta = _graded_marker(item)
            if meta is None:
                ungraded.append(item.nodeid)
                continue
            if meta.get("gpu") and not self.has_gpu:
                continue
            doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
            tests.append(
                {
                    "nodeid": item.nodeid,
                    "name": item.name.removeprefix("test_"),
                    "description": doc[0] if doc else "",
                    **meta,
                }
            )
        self.channel.send("collected", tests=tests, ungraded=ungraded, errors=self.errors)


def _has_gpu() -> bool:
    """Whether torch sees a CUDA device; without a GPU's device node, known without importing
    torch, which took 3 of the 4.5 s a judge of a torch lab needed to start on a laptop."""
    if not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/kfd").exists():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: The only third-party pytest plugin the judge loads (``main`` turns off pytest's autoloading).
PLUGINS = ("_hypothesis_pytestplugin",)


def _pytest_args(suite: str, nodeids: list[str]) -> list[str]:
    repo = Path(__file__).resolve().parent.parent
    return [
        *([str(repo / n) for n in nodeids] or [suite]),
        f"--rootdir={repo}",
        "-c",
        str(repo / "grading" / "suite.ini"),
        f"--confcutdir={suite}",
        *(arg for plugin in PLUGINS for arg in ("-p", plugin)),
        "-p",
        "no:cacheprovider",
        "-q",
        "-s",
        "--no-header",
        # The results go over the pipe; a failure report would print learner data again, into a
        # log capped at MAX_LOG_BYTES whose overflow kills the judge.
        "--tb=no",
        "-rN",
        "-p",
        "no:warnings",
        "-p",
        "no:unraisableexception",
        "--import-mode=importlib",
    ]


def _undefined_symbols(lab_id: str, modules: list[str]) -> str | None:
    """Graded classes and functions must be written in the submitted file, not imported.

    Read from the file's syntax tree (the judge never imports it): a name the lab grades that
    the file does not define with ``def`` or ``class`` at top level is refused.
    """
    lab = load_lab(lab_id)
    for module in modules:
        path = Path(os.environ[IMPL_ENV]) / f"{module}.py"
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError):
            return None  # the import reports it, with the learner's line number
        defined = {
            n.name
            for n in tree.body
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        }
        wanted = {q.split(".")[0] for q in lab.tasks.get(f"{module}.py", {})}
        missing = sorted(wanted - defined)
        if missing:
            return (
                f"{module}.py must define {', '.join(missing)} itself (with `class` or "
                "`def`), not import or assign it: the grader grades the code you wrote"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    harden_process()
    parser = argparse.ArgumentParser(prog="python -m grading.child")
    parser.add_argument("mode", choices=["collect", "preflight", "run"])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--lab", required=True)
    parser.add_argument("--staging", help="the learner sandbox's staged folder")
    parser.add_argument(
        "--tests", help="JSON file: the node ids to run, each with its timeout (run mode)"
    )
    parser.add_argument("--modules", nargs="*", default=[], help="modules to pre-import")
    parser.add_argument("--needs-torch", action="store_true")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per test")
    parser.add_argument("--exitfirst", action="store_true", help="stop at the first failure")
    args = parser.parse_args(argv)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    # Whatever pytest plugins happen to be installed (anyio's, randomly's) stay out of the
    # judge: it runs with the plugins it names. Autoloading also had pytest re-rewrite every
    # module of each plugin's package at every start (no bytecode cache here): 1.4 s a judge.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    channel = Channel(args.report_fd)

    if args.mode == "collect":
        has_gpu = args.needs_torch and _has_gpu()
        return (
            pytest.main(
                [*_pytest_args(args.suite, []), "--collect-only"],
                plugins=[Collector(channel, has_gpu)],
            )
            and 0
        )

    SESSION.staging = Staging.load(Path(args.staging), load_lab(args.lab))
    SESSION.gpu = args.needs_torch and _has_gpu()
    SESSION.preload = ("numpy",)

    if args.mode == "preflight":
        SESSION.deadline = time.monotonic() + args.timeout
        status, message = "ok", ""
        try:
            for module in args.modules:
                load_impl(module)
            undefined = _undefined_symbols(args.lab, args.modules)
            if undefined:
                status, message = "error", undefined
        except (NotImplementedError, LearnerNotStarted) as exc:
            status, message = "not_started", protocol.clip(str(exc))
        except LearnerFault as exc:
            status, message = exc.outcome, _describe(exc)
        except BaseException as exc:
            status, message = "error", _describe(exc)
        finally:
            SESSION.end_test(passed=False)
        channel.send("preflight", status=status, message=message)
        return 0

    timeouts = json.loads(Path(args.tests).read_text()) if args.tests else {}
    nodeids = list(timeouts)
    reporter = Reporter(channel, timeouts, args.timeout)
    extra = ["--exitfirst"] if args.exitfirst else []
    try:
        pytest.main([*_pytest_args(args.suite, nodeids), *extra], plugins=[reporter])
    finally:
        SESSION.end_test(passed=False)
    channel.send("done")
    return 0


if __name__ == "__main__":
    status = main()
    # Everything is reported and the learner process is gone: skip the interpreter's teardown,
    # which took a torch lab's judge about a second (per graded mutant, a third of its time).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
