"""The grading child: collects, pre-imports or runs a lab's suite and reports to the parent.

Run as ``python -m grading.child MODE --suite DIR --report-fd N [--tests FILE]`` with the
nonce as the first line of stdin. MODE is ``collect`` (list the graded tests; no graded code
runs), ``preflight`` (import the graded modules once, so a broken file is reported once
instead of once per test) or ``run`` (run the listed tests, reporting each as it ends).
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from _pytest import python as _pt_python
from _pytest import reports as _pt_reports
from _pytest import runner as _pt_runner

from grading import protocol
from grading.suite import IMPL_ENV, load_impl

_write = os.write  # bound before any graded code can replace it


class Channel:
    """Writes nonce-tagged events to the parent on a private file descriptor."""

    def __init__(self, fd: int, nonce: str) -> None:
        self._fd = fd
        self._nonce = nonce

    def send(self, event: str, **fields: Any) -> None:
        data = protocol.encode(self._nonce, event, **fields)
        while data:
            data = data[_write(self._fd, data) :]


def _graded_marker(item: pytest.Item) -> dict[str, Any] | None:
    marker = item.get_closest_marker("graded")
    return dict(marker.kwargs) if marker else None


def _describe(exc: BaseException, tb: Any) -> str:
    """One readable paragraph: the exception and where it came from in the graded code."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    impl = os.environ.get(IMPL_ENV, "")
    frames = [f for f in traceback.extract_tb(tb) if impl and f.filename.startswith(impl)]
    if frames:
        last = frames[-1]
        text += f"\n  at {Path(last.filename).name}:{last.lineno} in {last.name}"
    return protocol.clip(text)


class Integrity:
    """Remembers the objects that decide an outcome and notices when they are replaced.

    Graded code runs in this process, so it could monkeypatch pytest, the test modules or
    this reporter to turn failures into passes; the parent zeroes a run that did.
    """

    def __init__(self) -> None:
        self._watched: list[tuple[str, object, str, object]] = []

    def watch(self, label: str, owner: object, names: list[str] | None = None) -> None:
        namespace = vars(owner)
        for name in names if names is not None else list(namespace):
            if name in namespace:
                self._watched.append((label, owner, name, namespace[name]))

    def broken(self) -> str | None:
        for label, owner, name, original in self._watched:
            if vars(owner).get(name, _MISSING) is not original:
                return f"{label}.{name}"
        return None


_MISSING = object()


class Reporter:
    """A pytest plugin that turns each test's phases into one outcome for the parent."""

    def __init__(self, channel: Channel, integrity: Integrity) -> None:
        self.channel = channel
        self.integrity = integrity
        self._outcome: dict[str, tuple[str, str]] = {}
        self._started: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = (yield).get_result()
        if call.excinfo is None or report.passed:
            return
        exc = call.excinfo.value
        if report.skipped:
            self._record(item.nodeid, "skipped", str(getattr(exc, "msg", exc)))
        elif isinstance(exc, NotImplementedError):
            self._record(item.nodeid, "not_started", protocol.clip(str(exc)))
        else:
            outcome = "failed" if call.when == "call" else "error"
            self._record(item.nodeid, outcome, _describe(exc, call.excinfo.tb))

    def _record(self, nodeid: str, outcome: str, message: str) -> None:
        if nodeid not in self._outcome:  # the first failing phase tells the story
            self._outcome[nodeid] = (outcome, message)

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int, str]) -> None:
        self._started[nodeid] = time.perf_counter()
        self.channel.send("start", nodeid=nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int, str]) -> None:
        tampered = self.integrity.broken()
        if tampered:
            self.channel.send("tampered", nodeid=nodeid, what=tampered)
            os._exit(3)
        outcome, message = self._outcome.get(nodeid, ("passed", ""))
        duration = time.perf_counter() - self._started.get(nodeid, time.perf_counter())
        self.channel.send("result", nodeid=nodeid, outcome=outcome, message=message,
                          duration=round(duration, 3))


class Collector:
    """A pytest plugin that lists graded tests without running any of them."""

    def __init__(self, channel: Channel, has_gpu: bool) -> None:
        self.channel = channel
        self.has_gpu = has_gpu

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
            tests.append({
                "nodeid": item.nodeid,
                "name": item.name.removeprefix("test_"),
                "description": doc[0] if doc else "",
                **meta,
            })
        self.channel.send("collected", tests=tests, ungraded=ungraded)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _pytest_args(suite: str, nodeids: list[str]) -> list[str]:
    repo = Path(__file__).resolve().parent.parent
    return [
        *([str(repo / n) for n in nodeids] or [suite]),
        f"--rootdir={repo}",
        "-c", str(repo / "grading" / "suite.ini"),
        f"--confcutdir={suite}",
        "-p", "no:cacheprovider",
        "-p", "no:randomly",
        "-q", "-s", "--no-header", "-p", "no:warnings",
        "--import-mode=importlib",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.child")
    parser.add_argument("mode", choices=["collect", "preflight", "run"])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--tests", help="file with one node id per line (run mode)")
    parser.add_argument("--modules", nargs="*", default=[], help="modules to pre-import")
    parser.add_argument("--needs-torch", action="store_true")
    parser.add_argument("--exitfirst", action="store_true", help="stop at the first failure")
    args = parser.parse_args(argv)

    nonce = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - graded code gets no access to the pipe
    channel = Channel(args.report_fd, nonce)

    if args.mode == "collect":
        has_gpu = args.needs_torch and _has_gpu()
        return pytest.main(
            [*_pytest_args(args.suite, []), "--collect-only"],
            plugins=[Collector(channel, has_gpu)],
        ) and 0

    if args.mode == "preflight":
        for module in args.modules:
            try:
                load_impl(module)
            except NotImplementedError as exc:
                channel.send("preflight", status="not_started", message=protocol.clip(str(exc)))
                return 0
            except BaseException as exc:
                channel.send("preflight", status="error",
                             message=_describe(exc, exc.__traceback__))
                return 0
        channel.send("preflight", status="ok", message="")
        return 0

    nodeids = Path(args.tests).read_text().split("\n") if args.tests else []
    nodeids = [n for n in nodeids if n]
    integrity = Integrity()
    reporter = Reporter(channel, integrity)
    integrity.watch("pytest.runner", _pt_runner,
                    ["call_and_report", "runtestprotocol", "call_runtest_hook",
                     "check_interactive_exception"])
    integrity.watch("pytest.CallInfo", _pt_runner.CallInfo, ["from_call"])
    integrity.watch("pytest.python", _pt_python, ["pytest_pyfunc_call"])
    integrity.watch("pytest.Function", _pt_python.Function, ["runtest", "setup"])
    integrity.watch("pytest.TestReport", _pt_reports.TestReport, ["from_item_and_call"])
    integrity.watch("builtins", builtins, ["isinstance", "AssertionError", "NotImplementedError",
                                           "Exception", "BaseException", "len", "range"])
    integrity.watch("grading.child", sys.modules[__name__])
    integrity.watch("grading.child.Reporter", Reporter)
    integrity.watch("grading.child.Channel", Channel)
    integrity.watch("grading.child.Integrity", Integrity)
    integrity.watch("os", os, ["_exit", "write"])

    class WatchTestModules:
        """Once collected, the test modules' own functions and helpers are watched too."""

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            seen = set()
            for item in session.items:
                module = getattr(item, "module", None)
                if module is not None and id(module) not in seen:
                    seen.add(id(module))
                    integrity.watch(module.__name__, module)
            for name, module in list(sys.modules.items()):
                watched = name.startswith(("tests.", "numpy.testing", "mini_vllm.core.invariants"))
                if watched and id(module) not in seen:
                    seen.add(id(module))
                    integrity.watch(name, module)

    extra = ["--exitfirst"] if args.exitfirst else []
    pytest.main([*_pytest_args(args.suite, nodeids), *extra],
                plugins=[reporter, WatchTestModules()])
    channel.send("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
