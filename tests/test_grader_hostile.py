"""Hostile submissions (tests/hostile/): each gets its honest score, and the grader survives.

A case is a snippet appended to lab-01's stub (honest score 0) or solution (honest score: the
same bug written honestly, its ``# honest:`` line). Whatever the snippet does, at import or in
the methods it replaces, the grade must equal the honest one, every test must have a result,
and results.json must be the grader's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import site
import socket
import time
from pathlib import Path

import pytest

from grading import sandbox
from grading.labs import REPO_ROOT, load_lab
from grading.protocol import TestResult
from grading.report import print_table, totals, write_results_json
from grading.runner import SuiteRunner
from grading.sandbox import sandbox_mode

HOSTILE = Path(__file__).resolve().parent / "hostile"
LAB = load_lab("lab-01")
CASES = sorted(p.stem for p in HOSTILE.glob("*.py"))
#: Attacks on the file system and other processes hold only where the graded code runs as
#: another user (the grader as root: CI, Gradescope); an ordinary user's own checkout cannot.
needs_isolation = pytest.mark.skipif(
    sandbox_mode() == "none",
    reason="graded code runs as your own user here (the grader is not root): see docs/grader.md",
)


def header(name: str) -> dict[str, str]:
    fields = {}
    for line in (HOSTILE / f"{name}.py").read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            fields[key.strip()] = value.strip()
        elif not line.startswith("#"):
            break
    return fields


def lab_of(name: str):
    """The lab a case attacks: its ``# lab:`` line, lab-01 by default."""
    return load_lab(header(name).get("lab", "lab-01"))


def compose(name: str, dest: Path, honest: bool = False) -> Path:
    """``dest/<file>``: the case's base (its lab's first file) with the attack (or its honest
    twin) appended."""
    meta = header(name)
    lab = lab_of(name)
    base_dir = lab.solution_dir if meta.get("base") == "solution" else lab.stub_dir
    # A ``# chain:`` case attacks from an earlier lab's file (chained_for): the lab's own file
    # holds the honest bug in both grades.
    tail = meta["honest"] if honest or "chain" in meta else (HOSTILE / f"{name}.py").read_text()
    dest.mkdir(parents=True, exist_ok=True)
    base = (base_dir / lab.files[0]).read_text()
    (dest / lab.files[0]).write_text(base + "\n\n" + tail + "\n")
    return dest


def chained_for(name: str, dest: Path, honest: bool = False) -> list[tuple[Path, str, dict]]:
    """The ``--chain`` of a case with a ``# chain: lab-NN`` line: that earlier lab's solution,
    with the attack appended unless ``honest``, standing in for its reference symbols (as the
    learner's own finished earlier lab does under ``--chain``). Empty for any other case."""
    earlier = header(name).get("chain")
    if not earlier:
        return []
    lab = load_lab(earlier)
    folder = dest / "chain" / lab.dirname
    folder.mkdir(parents=True, exist_ok=True)
    chain = []
    for filename, provides in lab.provides.items():
        text = (lab.solution_dir / filename).read_text()
        if not honest and filename == lab.files[0]:
            text += "\n\n" + (HOSTILE / f"{name}.py").read_text() + "\n"
        (folder / filename).write_text(text)
        chain.append((folder, filename, provides))
    return chain


def grade(
    folder: Path,
    timeout: float | None = 4.0,
    first: int | None = 6,
    lab=LAB,
    only: str | None = None,
    chain: list[tuple[Path, str, dict]] | None = None,
) -> list[TestResult]:
    """Grade ``folder``: its first ``first`` tests, or those whose node id contains one of the
    comma-separated names in ``only`` (a case's ``# tests:`` line: the tests it attacks and one
    it leaves alone, so that a whole suite is not graded twice for one attack)."""
    runner = SuiteRunner(lab, folder, chain, timeout=timeout, preflight_timeout=10.0)
    tests = runner.collect()
    if only:
        names = [n.strip() for n in only.split(",")]
        tests = [t for t in tests if any(n in t.nodeid for n in names)]
        assert len(tests) >= len(names), f"{only!r} names a test that does not exist"
    return runner.run(tests[:first] if first else tests)


def assert_sound(results: list[TestResult], lab=LAB) -> None:
    """Every test has exactly one result with a known outcome, and the report renders."""
    assert results and all(
        r.outcome in ("passed", "failed", "not_started", "error", "timeout", "crashed", "skipped")
        for r in results
    )
    print_table(lab, results, verbose=True)


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path).encode())
        h.update(path.read_bytes() if path.is_file() else b"-")
    return h.hexdigest()


@pytest.mark.parametrize("name", [c for c in CASES if header(c).get("base") != "solution"])
def test_attack_on_the_stub_scores_zero(name, tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_VLLM_TEST_SECRET", "s3cr3t-token-value")
    if (
        name in ("write_to_the_course", "read_the_solution", "signal_the_grader", "late_writers")
        and sandbox_mode() == "none"
    ):
        pytest.skip("graded code runs as your own user here: see docs/grader.md")
    guarded = [
        *(REPO_ROOT / "tests" / "labs" / "lab_01").glob("*.py"),
        *(REPO_ROOT / "grading").glob("*.py"),
        *LAB.solution_dir.glob("*.py"),
    ]
    before = digest(guarded)
    results_path = tmp_path / "results" / "results.json"
    started = time.monotonic()
    first = 2 if name in ("loop_in_method", "resource_hog", "output_flood") else 6
    lab = lab_of(name)
    only = header(name).get("tests")
    results = grade(compose(name, tmp_path / "impl"), first=first, lab=lab, only=only)
    elapsed = time.monotonic() - started
    write_results_json(lab, results, results_path)
    assert_sound(results, lab)
    assert totals(results)[0] == 0, [(r.info.name, r.outcome, r.message[:200]) for r in results]
    assert elapsed < 90, f"{name}: grading took {elapsed:.0f} s"
    text = json.dumps([r.message for r in results])
    assert "s3cr3t-token-value" not in text, "the grader's environment reached graded code"
    assert digest(guarded) == before, "graded code changed the suite, the grader or a solution"
    for folder in site.getsitepackages():
        assert not (Path(folder) / "sitecustomize.py").exists() or name != "write_to_the_course"
    if name == "late_writers":
        time.sleep(3)
    data = json.loads(results_path.read_text())
    assert data["score"] == 0 and all(t["name"] != "forged" for t in data["tests"])
    for test in data["tests"]:  # learner text is indented: only the grader's lines at the margin
        lines = test["output"].splitlines()
        margin = [line for line in lines[1:] if line and not line.startswith("    ")]
        assert margin in ([], lines[-3:]), (name, test["name"], margin[:5])


def _known_limit(name: str):
    """A case with a ``# not defended:`` line is an attack the grader does not stop yet, kept
    so: it must still succeed (a strict xfail), and the day it fails the mark comes off."""
    why = header(name).get("not defended")
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=why)) if why else name


@pytest.mark.parametrize(
    "name", [_known_limit(c) for c in CASES if header(c).get("base") == "solution"]
)
def test_under_scoring_attack_gets_the_honest_score(name, tmp_path):
    """A BaseException or an unprintable exception in one method costs only its tests."""
    lab, only = lab_of(name), header(name).get("tests")
    attacked = grade(
        compose(name, tmp_path / "attack"),
        timeout=None,
        first=None,
        lab=lab,
        only=only,
        chain=chained_for(name, tmp_path / "attack"),
    )
    honest = grade(
        compose(name, tmp_path / "honest", honest=True),
        timeout=None,
        first=None,
        lab=lab,
        only=only,
        chain=chained_for(name, tmp_path / "honest", honest=True),
    )
    assert_sound(attacked, lab)
    got = {r.info.name: r.score for r in attacked}
    want = {r.info.name: r.score for r in honest}
    assert got == want, {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    assert 0 < totals(attacked)[0] < totals(attacked)[1]


def test_hang_at_import_is_reported_once(tmp_path):
    started = time.monotonic()
    results = grade(compose("loop_on_import", tmp_path / "impl"), first=None)
    assert {r.outcome for r in results} == {"timeout"}
    assert time.monotonic() - started < 30, "one import timeout, not one per test"


def _processes_mentioning(text: str) -> list[str]:
    """``pid: command line`` of every process whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            found.append(f"{entry.name}: {command[:120]}")
    return found


def test_no_learner_process_outlives_a_judge_killed_at_the_budget(tmp_path):
    """Code that spins and never reads its requests, in a suite whose budget runs out before
    the test's own limit: the grader kills the judge, which never gets to end its learner
    process; that process must end with it (the learner's uid, killed by the grader, and the
    parent-death signal), not run on after the grade."""
    folder = compose("loop_in_method", tmp_path / "spin")
    lab = dataclasses.replace(LAB, budget=8.0)
    runner = SuiteRunner(lab, folder, timeout=120.0, preflight=False)
    tests = [t for t in runner.collect() if "popleft_takes_the_front" in t.nodeid]
    workdir = str(runner.workdir)
    results = runner.run(tests)
    assert [r.outcome for r in results] == ["timeout"], [r.message for r in results]
    deadline = time.monotonic() + 5
    while (left := _processes_mentioning(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"learner processes still running after the grade: {left}"


def test_crashes_are_named(tmp_path):
    results = grade(compose("segfault", tmp_path / "impl"), first=3)
    crashed = [r for r in results if r.outcome == "crashed"]
    assert crashed and "SIGSEGV" in crashed[0].message
    results = grade(compose("os_exit_in_test", tmp_path / "exit"), first=3)
    assert "crashed" in {r.outcome for r in results}


def test_a_reply_cheap_on_the_wire_cannot_swell_the_judge(tmp_path):
    """``bomb_the_judges_decoder`` sends 40 MB of empty msgpack lists a reply: decoded, 40
    million Python lists, over 2 GiB in the judge. Graded in a process of its own, so that the
    largest process it ever waited for is this grade's judge (or its learner processes), whose
    peak must stay near what an honest grade takes."""
    import subprocess
    import sys

    folder = compose("bomb_the_judges_decoder", tmp_path / "impl")
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from tests.test_grader_hostile import grade, header\n"
        "only = header('bomb_the_judges_decoder')['tests']\n"
        "results = grade(Path(sys.argv[1]), only=only)\n"
        "print(sum(r.score for r in results), "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", script, str(folder)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    score, peak_kib = (float(x) for x in done.stdout.split()[-2:])
    assert score == 0
    assert peak_kib < 1024 * 1024, (
        f"the judge (or a learner process) peaked at {peak_kib / 1024:.0f} MiB"
    )


def test_markup_is_shown_literally(tmp_path, capsys):
    results = grade(compose("crash_the_report", tmp_path / "impl"), first=None)
    capsys.readouterr()
    print_table(LAB, results, verbose=True)
    shown = capsys.readouterr().out
    assert "[bold green]PASS[/]" in shown, "learner text must not be read as rich markup"


@needs_isolation
def test_the_learner_runs_as_another_user_in_its_own_namespace(tmp_path):
    """The sandbox itself: another uid, no course folder, a private /tmp, no way out."""
    (tmp_path / "impl").mkdir()
    probe = tmp_path / "impl" / "block_pool.py"
    paths = (
        f"SOLUTION = {str(LAB.solution_dir / 'block_pool.py')!r}\n"
        f"GRADER = {str(REPO_ROOT / 'grading' / 'child.py')!r}\n"
    )
    probe.write_text(
        (LAB.stub_dir / "block_pool.py").read_text()
        + paths
        + """
import os as _os
def _probe():
    seen = {"uid": _os.getuid(), "groups": _os.getgroups(),
            "repo": _os.path.exists(SOLUTION), "tests": _os.path.exists(GRADER),
            "env": sorted(_os.environ)}
    raise NotImplementedError("PROBE " + repr(seen))
FreeKVCacheBlockQueue.__init__ = lambda self, blocks: _probe()
"""
    )
    results = grade(tmp_path / "impl", first=None)
    probe_text = next(r.message for r in results if "PROBE" in r.message)
    seen = eval(probe_text.split("PROBE ", 1)[1].splitlines()[0])  # our own probe's repr
    assert seen["uid"] != os.getuid() and seen["groups"] == []
    if sandbox_mode() == "namespace":
        assert not seen["repo"] and not seen["tests"], f"the course folder is visible: {seen}"
    assert "MINI_VLLM_TEST_SECRET" not in seen["env"]
    assert set(seen["env"]) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "TZ",
        "USER",
        "LOGNAME",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "TRITON_INTERPRET",
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NVIDIA_VISIBLE_DEVICES",
        "TRITON_CACHE_DIR",
    }


def _sysv_keys() -> set[int]:
    """Keys of every System V shared memory segment and message queue on this machine."""
    keys = set()
    for table in ("shm", "msg"):
        header, *rows = Path(f"/proc/sysvipc/{table}").read_text().splitlines()
        at = header.split().index("key")
        keys |= {int(row.split()[at]) for row in rows}
    return keys


@needs_isolation
def test_nothing_the_learner_creates_outlives_it_or_reaches_out(tmp_path):
    """System V shared memory and message queues outlive every process (a channel to the next
    grade, and memory held until reboot); a socket reaches whatever listens on the host. The
    learner's IPC objects end with it, and in a namespace it has no network at all."""
    key = 0x4D564C4D  # "MVLM"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "block_pool.py").write_text(
        (LAB.stub_dir / "block_pool.py").read_text()
        + f"""
import ctypes as _ct, os as _os, socket as _socket
_libc = _ct.CDLL(None, use_errno=True)
def _probe():
    seen = {{"shm": _libc.shmget({key}, 4096, 0o1600), "msg": _libc.msgget({key}, 0o1600)}}
    open("/dev/shm/mini-vllm-probe", "w").close()
    try:
        _socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=2).close()
        seen["connected"] = True
    except OSError:
        seen["connected"] = False
    raise NotImplementedError("PROBE " + repr(seen))
FreeKVCacheBlockQueue.__init__ = lambda self, blocks: _probe()
"""
    )
    try:
        results = grade(tmp_path / "impl", first=2)
    finally:
        listener.close()
    probe_text = next(r.message for r in results if "PROBE" in r.message)
    seen = eval(probe_text.split("PROBE ", 1)[1].splitlines()[0])  # our own probe's repr
    assert seen["shm"] >= 0 and seen["msg"] >= 0, f"the probe could not create them: {seen}"
    assert key not in _sysv_keys(), "the learner's shared memory or message queue outlived it"
    assert not Path("/dev/shm/mini-vllm-probe").exists()
    if sandbox_mode() == "namespace":
        assert not seen["connected"], "the learner reached a socket listening on the host"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_uid_mode_removes_what_the_learner_uid_left():
    """Where no namespace ends them (``uid`` mode: a container without ``unshare``), the judge
    removes the learner uid's IPC objects and its files in the world-writable folders."""
    import ctypes

    uid, key = 200_000 + os.getpid() % 100_000, 0x4D564C4E
    pid = os.fork()
    if pid == 0:  # the learner: another uid, leaving things behind
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            libc = ctypes.CDLL(None, use_errno=True)
            ok = libc.shmget(key, 4096, 0o1600) >= 0 and libc.msgget(key, 0o1600) >= 0
            for folder in sandbox.shared_dirs():
                try:  # /dev/mqueue holds queues, not folders
                    Path(folder, f"mini-vllm-left-{uid}").mkdir()
                    Path(folder, f"mini-vllm-left-{uid}", "f").write_text("x")
                except OSError:
                    if folder in ("/tmp", "/var/tmp", "/dev/shm"):
                        raise
            os._exit(0 if ok else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0, "the child could not create its objects"
    assert key in _sysv_keys()
    sandbox.remove_owned_by(uid)
    assert key not in _sysv_keys()
    left = [f for f in sandbox.shared_dirs() if Path(f, f"mini-vllm-left-{uid}").exists()]
    assert not left, f"left in {left}"


def test_a_results_file_left_before_grading_never_counts(tmp_path):
    """The CLI deletes results.json first and writes its own atomically."""
    import subprocess
    import sys

    out = tmp_path / "results.json"
    out.write_text(json.dumps({"score": 999, "tests": []}))
    impl = compose("exit_on_import", tmp_path / "impl")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "lab-01",
            "--impl",
            str(impl),
            "--json",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["score"] == 0 and data["tests"]
    assert not list(tmp_path.glob(".results-*")), "no temporary file is left behind"


USERNS_CASES = [
    "read_the_solution",
    "write_to_the_course",
    "late_writers",
    "signal_the_grader",
    "reexport_reference",
]


@pytest.mark.skipif(
    not sandbox._can_unshare(sandbox.USERNS),
    reason="no unprivileged user namespaces on this machine",
)
@pytest.mark.parametrize("name", USERNS_CASES)
def test_user_namespace_mode_confines_too(name, tmp_path, monkeypatch):
    """The mode an ordinary user gets where user namespaces are allowed: same honest score."""
    monkeypatch.setenv(sandbox.MODE_ENV, "userns")
    guarded = [
        *(REPO_ROOT / "tests" / "labs" / "lab_01").glob("*.py"),
        *(REPO_ROOT / "grading").glob("*.py"),
        *LAB.solution_dir.glob("*.py"),
    ]
    before = digest(guarded)
    results = grade(compose(name, tmp_path / "impl"), first=6)
    assert_sound(results)
    assert totals(results)[0] == 0, [(r.info.name, r.outcome, r.message[:200]) for r in results]
    if name == "late_writers":
        time.sleep(3)
    assert digest(guarded) == before
