"""Where the learner process runs: a staged folder, and the strongest confinement the OS gives.

The judge stages what the graded code may see into one folder: the submitted files (copies),
the part of ``mini_vllm`` the lab imports with the lab's own functions and their twins stubbed
out (so re-exporting the reference scores what the stub scores), the suite's learner-side
helpers and the host program. Then it starts the learner process in one of three
confinements, the strongest available:

``namespace`` (the grader runs as root and ``unshare`` works, as in CI and most containers):
    new mount, PID, IPC, network and UTS namespaces (no network at all, and no shared memory
    or socket that another grade can reach); the course folder is covered by empty read-only
    mounts, ``/tmp`` and ``/dev/shm`` are fresh size-limited tmpfs, ``/proc`` shows only the
    sandbox;
    the process drops to an unused uid with no groups and ``no_new_privs``; when it ends, the
    kernel ends every process it started.
``uid`` (root, no namespaces, e.g. a container without ``CAP_SYS_ADMIN``):
    the same unprivileged uid, limits and environment; afterwards every process of that uid is
    killed and its System V IPC objects and its entries in ``/tmp``, ``/var/tmp`` and
    ``/dev/shm`` are removed. Files are protected by their permissions (the Gradescope bundle
    makes its source folder root-only).
``none`` (an ordinary user grading their own checkout): resource limits, an allow-listed
    environment, a fresh session; the graded code can read what its user can read.

In every mode the verdict is safe: it is decided in the judge, which never runs learner code.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from grading.labs import REPO_ROOT, Lab

MODE_ENV = "MINI_VLLM_SANDBOX"
HOST_FILES = ("learner_host.py", "wire.py")
#: Variables the learner process may see; everything else (tokens, keys, paths) stays out.
ENV_ALLOW = (
    "LANG",
    "LC_ALL",
    "TZ",
    "TRITON_INTERPRET",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NVIDIA_VISIBLE_DEVICES",
    "TRITON_CACHE_DIR",
)
LOG_CAP = 8 * 1024 * 1024


@dataclass
class Limits:
    fsize: int = 64 * 1024 * 1024
    tmp_mib: int = 256
    nproc: int = 256
    #: Address space for CPU labs; CUDA needs far more virtual memory, so GPU runs set none.
    address_space: int | None = 8 * 1024**3


@dataclass
class Staging:
    """A folder holding everything the learner process may read."""

    root: Path
    lab: Lab
    chain_dirs: list[tuple[str, str, dict]] = field(default_factory=list)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    def load(cls, root: Path, lab: Lab) -> Staging:
        """The staging a grader built, as the judge finds it (``staging.json`` beside it)."""
        meta = json.loads((root / "staging.json").read_text())
        return cls(root, lab, [tuple(c) for c in meta["chain"]])  # type: ignore[misc]


# CPython 3.11 keeps ast.parse's recursion-depth count per interpreter, not per thread, and can
# raise "SystemError: AST constructor recursion depth mismatch" when threads parse at once
# (CPython gh-106905). Suites are graded in threads (check_suites), so parses take turns.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse``, safe to call from several threads at once."""
    with _PARSE_LOCK:
        return ast.parse(source)


def _stub_source(
    source: str, qualnames: list[str], lab_id: str, why: str = "yours to write"
) -> str:
    """``source`` with the body of each function named in ``qualnames`` that it defines replaced."""
    tree = parse_python(source)
    lines = source.splitlines()
    edits = []
    for qualname in qualnames:
        scope: list[ast.stmt] = tree.body
        parts = qualname.split(".")
        found = None
        for i, part in enumerate(parts):
            node = next((n for n in scope if getattr(n, "name", None) == part), None)
            if node is None:
                break
            if i == len(parts) - 1 and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found = node
            elif isinstance(node, ast.ClassDef):
                scope = node.body
        if found is None:
            continue
        first = found.body[0]
        indent = " " * first.col_offset
        message = f"{lab_id}: {qualname} is {why} (the reference is not available here)"
        edits.append(
            (
                first.lineno - 1,
                found.end_lineno or found.lineno,
                [f"{indent}raise NotImplementedError({message!r})"],
            )
        )
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start:end] = replacement
    return "\n".join(lines) + "\n"


def graded_modules(lab: Lab) -> list[str]:
    """The reference modules that hold the lab's graded code."""
    modules = list(lab.reference)
    for provides in lab.provides.values():
        modules += [m for m in provides if m not in modules]
    return modules


#: Staged for every lab: small helpers a learner may import anywhere, with nothing graded.
ALWAYS_STAGED = ("mini_vllm.utils.math_utils",)


def _module_file(module: str) -> Path | None:
    path = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(source: str) -> set[str]:
    """Every ``mini_vllm`` module a source names in an import, lazy ones included (``from
    mini_vllm.x import y`` names ``mini_vllm.x`` and, if it is a module, ``mini_vllm.x.y``)."""
    found = set()
    for node in ast.walk(parse_python(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] == "mini_vllm" and _module_file(m)}


def staged_modules(lab: Lab, sources: list[Path], chained: list[str] | None = None) -> list[str]:
    """The ``mini_vllm`` modules the learner process holds: the import closure of the lab's
    graded modules (the stub's own imports are among them), of the given ``sources`` (the
    suite's learner-side helpers), of the ``chained`` modules (whose symbols ``--chain``
    replaces with earlier labs') and of :data:`ALWAYS_STAGED`, with their packages. Nothing
    else of the engine is there: another module may implement what the lab grades (the
    engine's torch attention does lab-06's numpy one), and a module that is not staged cannot
    be re-exported."""
    todo = [*graded_modules(lab), *ALWAYS_STAGED, *(chained or [])]
    for path in sources:
        todo += _imports(path.read_text())
    seen: set[str] = set()
    while todo:
        parts = todo.pop().split(".")
        for depth in range(1, len(parts) + 1):
            module = ".".join(parts[:depth])
            path = _module_file(module)
            if module not in seen and path is not None:
                seen.add(module)
                todo += _imports(path.read_text())
    return sorted(seen)


#: The largest learner file the grader reads as text (a lab file is tens of kilobytes).
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def _regular_file_bytes(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` if it is a regular file itself, never through a symbolic link (the
    grader may run as root, and a link can name any file it can read, a solution included), a
    FIFO that would block, or a device; and of at most ``limit`` bytes. Else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        if limit is None:
            return source.read()
        return source.read(limit) if info.st_size <= limit else None


def read_regular_file(path: Path, limit: int = MAX_SOURCE_BYTES) -> str | None:
    """The text of ``path`` if it is a regular file itself of at most ``limit`` bytes."""
    data = _regular_file_bytes(path, limit)
    return None if data is None else data.decode(errors="replace")


def copy_regular_file(src: Path, dest: Path) -> None:
    """Copy ``src`` if it is a regular file itself (:func:`_regular_file_bytes`). Anything else
    is not staged, and grades as a missing file."""
    data = _regular_file_bytes(src)
    if data is not None:
        dest.write_bytes(data)


def stage(
    lab: Lab,
    impl: Path,
    chain: list[tuple[Path, str, dict]] | None = None,
    parent: Path | None = None,
) -> Staging:
    """Copy what the learner process may read into a fresh folder."""
    root = Path(tempfile.mkdtemp(prefix="mini-vllm-learner-", dir=parent))
    (root / "impl").mkdir()
    for filename in lab.files:
        copy_regular_file(impl / filename, root / "impl" / filename)
    (root / "newroot").mkdir()
    host = root / "host"
    host.mkdir()
    for name in HOST_FILES:
        shutil.copyfile(Path(__file__).with_name(name), host / name)
    lib = root / "lib"
    side = lab.suite_dir / "learner_side.py"
    sources = [side] if side.is_file() else []  # the bundle has no stubs: not a source
    chained = [module for _, _, provides in chain or [] for module in provides]
    for module in staged_modules(lab, sources, chained):
        src = _module_file(module)
        assert src is not None
        dest = lib / src.relative_to(REPO_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    qualnames = [q for tasks in lab.tasks.values() for q in tasks]
    for module in graded_modules(lab):
        path = lib.joinpath(*module.split(".")).with_suffix(".py")
        if path.is_file():
            path.write_text(_stub_source(path.read_text(), qualnames, lab.id))
    for module, twins in lab.twins.items():
        path = lib.joinpath(*module.split(".")).with_suffix(".py")
        path.write_text(
            _stub_source(path.read_text(), twins, lab.id, "another implementation of a task")
        )
    if side.is_file():
        shutil.copyfile(side, lib / side.name)
    chain_dirs = []
    for folder, filename, provides in chain or []:
        dest = root / "chain" / Path(folder).name
        dest.mkdir(parents=True, exist_ok=True)
        copy_regular_file(Path(folder) / filename, dest / filename)
        chain_dirs.append((Path(folder).name, filename, provides))
    (root / "staging.json").write_text(json.dumps({"chain": chain_dirs}))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Staging(root, lab, chain_dirs)


USERNS = ["--user", "--map-root-user"]
#: New mount, PID, IPC, network and host-name namespaces: shared memory, message queues,
#: semaphores and sockets (abstract Unix ones too) live and die with the learner process, and
#: nothing reaches another grade or the network.
UNSHARE = ["--mount", "--pid", "--ipc", "--net", "--uts", "--fork", "--kill-child", "--mount-proc"]


def _can_unshare(extra: list[str]) -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            ["unshare", *extra, *UNSHARE, "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


_MODE: str | None = None


def sandbox_mode() -> str:
    """``namespace``, ``userns``, ``uid`` or ``none``: the strongest confinement available."""
    global _MODE
    if _MODE is None:
        forced = os.environ.get(MODE_ENV, "")
        if forced in ("userns", "none") or (forced == "uid" and os.geteuid() == 0):
            _MODE = forced
        elif os.geteuid() != 0:
            _MODE = "userns" if _can_unshare(USERNS) else "none"
        else:
            _MODE = "namespace" if _can_unshare([]) else "uid"
        if _MODE == "uid" and _python_unreadable():
            print(
                "grading: Python is installed where an unprivileged user cannot read it; "
                "graded code runs without a separate user",
                file=sys.stderr,
            )
            _MODE = "none"
    return _MODE


def _python_folders() -> list[str]:
    """The folders of this Python installation (a venv and the Python it was made from)."""
    folders = set()
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        folders.add(str(Path(prefix)))
        folders.add(str(Path(prefix).resolve()))
    return sorted(folders)


def _closed_ancestor(path: Path) -> Path | None:
    """The highest folder above ``path`` that other users cannot enter (``/root``), if any."""
    for folder in reversed([path, *path.parents]):
        try:
            if not folder.stat().st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return None
    return None


def _python_unreadable() -> bool:
    """Python lives where another user cannot read it (pyenv under ``/root``)."""
    return any(_closed_ancestor(Path(p)) is not None for p in _python_folders())


def _package_folders() -> list[str]:
    """Where this Python finds packages, outside the course folder (site-packages, and any
    folder on PYTHONPATH): the learner process gets the same list, as ``python -I`` would
    otherwise drop PYTHONPATH."""
    folders: list[str] = []
    python = [Path(p) for p in _python_folders()]
    for entry in sys.path:
        if not entry or not Path(entry).is_dir():
            continue
        path = Path(entry).resolve()
        in_python = any(path == p or p in path.parents for p in python)
        in_course = path == REPO_ROOT or REPO_ROOT in path.parents
        if (in_course and not in_python) or str(path) in folders:
            continue
        folders.append(str(path))
    return folders


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    mode: str
    uid: int | None
    to_learner: int
    from_learner: int
    log: Path
    log_fd: int

    def kill(self) -> None:
        """End the learner process and everything it started."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.uid is not None:
            kill_uid(self.uid)
            if self.mode == "uid":  # a namespace takes these with it; here the uid owns them
                remove_owned_by(self.uid)
        for fd in (self.to_learner, self.from_learner, self.log_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def log_tail(self, limit: int = 2000) -> str:
        """The end of what the learner printed, read from the judge's own descriptor."""
        try:
            size = os.fstat(self.log_fd).st_size
            data = os.pread(self.log_fd, limit, max(0, size - limit))
        except OSError:
            return ""
        return data.decode(errors="replace")


def kill_uid(uid: int) -> None:
    """Kill every process of ``uid``: a child becomes that user and signals them all."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(3):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


#: ``/proc/sysvipc`` tables, with the column of each object's id and the ``ipcrm`` option.
SYSV_IPC = {"shm": ("shmid", "-m"), "msg": ("msqid", "-q"), "sem": ("semid", "-s")}
#: Where any user can write: what a learner's uid leaves here is removed after it.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/crash", "/dev/mqueue")


def shared_dirs() -> list[str]:
    """Every folder any user may write to: the usual ones, and any world-writable folder one
    level under ``/``, ``/var``, ``/run`` and ``/dev`` (images differ; a red-team helper left a
    file in ``/run/lock``, which outlived the grade)."""
    found = {os.path.realpath(p): None for p in SHARED_DIRS if os.path.isdir(p)}
    for parent in ("/", "/var", "/run", "/dev"):
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                        found[os.path.realpath(entry.path)] = None
    return list(found)


def remove_owned_by(uid: int) -> None:
    """Remove what ``uid`` could leave behind outside its processes: System V shared memory,
    message queues and semaphores (they outlive every process, and hold memory), and its
    entries in the world-writable folders. Used where no namespace ends them (``uid`` mode)."""
    for table, (id_column, option) in SYSV_IPC.items():
        with contextlib.suppress(OSError):
            header, *rows = Path(f"/proc/sysvipc/{table}").read_text().splitlines()
            names = header.split()
            for row in rows:
                fields = dict(zip(names, row.split(), strict=False))
                if fields.get("uid") == str(uid) or fields.get("cuid") == str(uid):
                    subprocess.run(
                        ["ipcrm", option, fields[id_column]], capture_output=True, check=False
                    )
    for folder in shared_dirs():
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


PR_SET_PDEATHSIG = 1

#: The uid a judge's learner processes run as, chosen by the grader that starts the judge, so
#: that the grader can end them even when it had to kill the judge first (``end_learners``).
LEARNER_UID_ENV = "MINI_VLLM_LEARNER_UID"


def new_learner_uid() -> int:
    """An unused uid, different for each judge, far above any real account."""
    return 200_000 + secrets.randbelow(700_000)


def _learner_uid() -> int:
    given = os.environ.get(LEARNER_UID_ENV, "")
    return int(given) if given.isdigit() and int(given) >= 200_000 else new_learner_uid()


def end_learners(uid: int) -> None:
    """What a judge's learner processes left, ended by the grader after the judge: every
    process of ``uid`` (a namespace dies with its first process) and, outside a namespace,
    what the uid left in shared folders. Only root can; other modes have no uid of their own,
    and there the learner process dies with the process that started it (PR_SET_PDEATHSIG)."""
    if os.geteuid() != 0:
        return
    kill_uid(uid)
    remove_owned_by(uid)


def launch(
    staging: Staging,
    *,
    gpu: bool = False,
    limits: Limits | None = None,
    uid: int | None = None,
    preload: tuple[str, ...] = (),
) -> Launched:
    """Start a learner process for ``staging``; it answers ``ready`` once confined."""
    limits = limits or Limits()
    judge = os.getpid()  # the learner process dies with it (PR_SET_PDEATHSIG)
    mode = sandbox_mode()
    if gpu and mode == "namespace" and not _python_unreadable():
        # The GPU driver's libraries sit in host-specific mounts (``/usr/local/nvidia`` on
        # some images) that the minimal root does not reproduce: a GPU run is confined by uid.
        mode = "uid"
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    log_dir = Path(tempfile.mkdtemp(prefix="mini-vllm-log-"))
    log = log_dir / "learner.log"
    log_fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    learner_uid = (uid or _learner_uid()) if mode in ("namespace", "uid") else None
    namespaced = mode in ("namespace", "userns")
    root = "/tmp/mini-vllm-sandbox" if namespaced else str(staging.root)
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    # USER/LOGNAME: the learner's uid has no passwd entry, and getpass.getuser() (torch's
    # compile caches call it) would otherwise fail.
    env.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONHASHSEED": "0",
            "USER": "learner",
            "LOGNAME": "learner",
        }
    )
    env.setdefault("LANG", "C.UTF-8")
    config = {
        "fd_in": to_r,
        "fd_out": from_w,
        "staging": str(staging.root),
        "root": root,
        "namespace": namespaced,
        "new_root": str(staging.root / "newroot"),
        "python": sorted({*_python_folders(), *_package_folders()}),
        "tmp_mib": limits.tmp_mib,
        "uid": learner_uid,
        "parent": judge,
        "env": env,
        "site": _package_folders(),
        "preload": list(preload),
        "chain": [[f"{root}/chain/{d}", f, p] for d, f, p in staging.chain_dirs],
        "limits": {
            "fsize": limits.fsize,
            "nproc": limits.nproc if learner_uid is not None else None,
            "address_space": None if gpu else limits.address_space,
        },
    }
    # -I drops PYTHONPATH: the host (msgspec) must find the packages the judge finds.
    paths = [str(staging.root / "host"), *_package_folders()]
    bootstrap = (
        f"import sys; sys.path[:0] = [p for p in {paths!r} if p not in sys.path]; "
        "import learner_host; learner_host.main()"
    )
    argv = [sys.executable, "-I", "-c", bootstrap, json.dumps(config)]
    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_the_judge() -> None:  # in the child, before exec: see learner_host
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != judge:
            os._exit(70)

    if namespaced:
        argv = ["unshare", *(USERNS if mode == "userns" else []), *UNSHARE, *argv]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(to_r, from_w),
            start_new_session=True,
            cwd=staging.root,
            env=env,
            preexec_fn=die_with_the_judge,
        )
    finally:
        os.close(to_r)
        os.close(from_w)
    os.unlink(log)
    os.rmdir(log_dir)
    return Launched(proc, mode, learner_uid, to_w, from_r, log, log_fd)
