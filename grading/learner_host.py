"""The learner process: it imports the graded code and runs what the judge asks, nothing more.

``python -I learner_host.py CONFIG`` (the judge starts it; see ``grading/sandbox.py``). First,
still privileged where the grader runs as root, it closes the sandbox around itself: the course
folders hidden, a private size-limited ``/tmp``, resource limits, an unprivileged user. Then it
serves requests on two pipes: import a module, read or set an attribute, call something, and
return the result as data (``grading/wire.py``); objects that are not data stay here and the
judge gets a handle. It decides nothing: every assertion runs in the judge, on the data it got.

This file runs from a copy in the sandbox, so it imports only the standard library, msgspec
(through ``wire``) and whatever the graded code imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import json
import os
import resource
import select
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import wire  # the sandbox's copy of grading/wire.py, next to this file

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE, MS_RDONLY, MS_NOSUID, MS_NODEV = 4096, 16384, 1 << 18, 1, 2, 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1


# -- the sandbox ------------------------------------------------------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = _libc()
    rc = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


#: What the sandbox's root holds besides Python and the staged folder: the system, no data.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "sys")
MS_REMOUNT, MNT_DETACH = 32, 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
PR_CAPBSET_DROP = 24


def _bind(source: str, target: str, *, writable: bool = False, recursive: bool = False) -> None:
    """Bind ``source`` at ``target``, read-only unless ``writable`` (remounted, as the kernel
    applies ``MS_RDONLY`` to a bind mount only on a remount)."""
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.makedirs(target, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | (MS_REC if recursive else 0), None)
    finally:
        os.close(fd)
    if not writable:
        _mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, None)


def _pivot_into(new: str) -> None:
    """Make ``new`` the root and detach the old one: no ``..`` leads back out of it."""
    import platform

    libc = _libc()
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None or libc.syscall(number, b".", b".") != 0:
        os.chroot(".")  # no pivot_root here: chroot, and the uid drop keeps it shut
    elif libc.umount2(b".", MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "could not detach the old root")
    os.chdir("/")


def _enter_minimal_root(config: dict[str, Any]) -> None:
    """In our own mount and PID namespaces (made by ``unshare``): build a new root holding only
    the system folders and the Python installation (read-only) and the staged folder, then
    make it the root.

    Nothing else of the machine exists inside: no course checkout, no other copy of it, no
    home folders, no results folder. ``/tmp`` and ``/dev/shm`` are fresh size-limited tmpfs.
    """
    staging = config["staging"]
    # In a user namespace the mounts under /dev and /sys are locked to their parents: they
    # must come along (a bind without them would uncover what they hide).
    whole = config.get("uid") is None
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    new = config["new_root"]
    _mount("sandbox-root", new, "tmpfs", MS_NOSUID, "size=1m,mode=755")
    for name in SYSTEM_DIRS:
        source = f"/{name}"
        if os.path.islink(source):
            os.symlink(os.readlink(source), f"{new}/{name}")
        elif os.path.isdir(source):
            _bind(source, f"{new}/{name}", writable=name == "dev", recursive=whole)
    size = f"size={config['tmp_mib']}m,mode=1777"
    for tmp in ("/tmp", "/dev/shm"):
        os.makedirs(f"{new}{tmp}", exist_ok=True)
        _mount("learner-tmp", f"{new}{tmp}", "tmpfs", MS_NOSUID | MS_NODEV, size)
    for prefix in config["python"]:  # after /tmp: packages may live under it (PYTHONPATH)
        if not prefix.startswith(("/usr/", "/etc/")) and os.path.isdir(prefix):
            _bind(prefix, f"{new}{prefix}", recursive=whole)
    _bind(staging, f"{new}{config['root']}")
    os.makedirs(f"{new}/proc", exist_ok=True)
    _mount("proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV, None)
    _pivot_into(new)


def _drop_capabilities() -> None:
    """In a user namespace (no uid to drop to): give up every capability, for good."""
    libc = _libc()
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "could not drop capabilities")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _limit(config: dict[str, Any]) -> None:
    limits = config["limits"]
    wanted = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, limits["fsize"]),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_AS, limits.get("address_space")),
        (resource.RLIMIT_NPROC, limits.get("nproc")),
    ]
    for which, value in wanted:
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError("could not drop privileges")


def _die_with_the_judge(config: dict[str, Any]) -> None:
    """Be killed with the process that started this one, whatever the learner code does.

    That process is the judge, or ``unshare``, which the judge's death kills in turn. A judge
    stopped by the grader (the suite's budget, a stuck test) never gets to kill this process
    itself, and learner code that never reads its requests would never notice. Changing the
    uid clears the setting, so it is made after the drop; a judge that died before it is seen
    through its parent id (outside a PID namespace) or its closed end of the request pipe.
    """
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = config.get("parent")
    if parent is not None and not config.get("namespace") and os.getppid() != parent:
        os._exit(70)
    poll = select.poll()
    poll.register(config["fd_in"], select.POLLHUP)
    if poll.poll(0):
        os._exit(70)


def enter_sandbox(config: dict[str, Any]) -> Path:
    """Close the sandbox; return the folder the learner code works in."""
    if config.get("namespace"):
        _enter_minimal_root(config)
    root = Path(config["root"])
    # In a namespace /tmp is the sandbox's own tmpfs; otherwise a fresh folder of the staging.
    work = Path("/tmp/work") if config.get("namespace") else root / f"work-{os.getpid()}"
    work.mkdir(exist_ok=True)
    uid = config.get("uid")
    if uid is not None:
        os.chown(work, uid, uid)
    _limit(config)
    if uid is not None:
        _drop_privileges(uid)
    elif config.get("namespace"):
        _drop_capabilities()
    _die_with_the_judge(config)
    os.chdir(work)
    os.environ.clear()
    os.environ.update(config["env"])
    os.environ["HOME"] = os.environ["TMPDIR"] = str(work)
    sys.path[:] = [
        str(root / "impl"),
        str(root / "lib"),
        *[p for p in config["site"] if os.path.isdir(p)],
    ]
    return work


# -- serving the judge ---------------------------------------------------------------------
class Host:
    """Keeps the objects the judge holds handles to, and runs its requests."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.impl = str(Path(config["root"]) / "impl")
        self.chain = config.get("chain") or []
        self.objects: dict[int, Any] = {}
        self.by_identity: dict[int, int] = {}
        self.type_ids: dict[int, int] = {}
        self.next_hid = 1
        self.decoder = wire.Decoder(self._resolve, self._enum)
        self.chain_applied = False

    # handles
    def _to_handle(self, obj: Any) -> list[Any]:
        hid = self.by_identity.get(id(obj))
        if hid is None:
            hid = self.next_hid
            self.next_hid += 1
            self.objects[hid] = obj
            self.by_identity[id(obj)] = hid
        cls = type(obj)
        type_id = self.type_ids.get(id(cls))
        methods = None
        if type_id is None:
            type_id = len(self.type_ids) + 1
            self.type_ids[id(cls)] = type_id
            methods = _method_names(cls)
        return [hid, type_id, _type_name(cls), methods]

    def _resolve(self, payload: list[Any]) -> Any:
        try:
            return self.objects[int(payload[0])]
        except (KeyError, IndexError, TypeError, ValueError):
            raise wire.WireError("a handle to an object that no longer exists") from None

    def _enum(self, module: str, qualname: str, name: str) -> Any:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        return target[name]

    def release(self, hids: list[int]) -> None:
        for hid in hids:
            obj = self.objects.pop(hid, None)
            if obj is not None:
                self.by_identity.pop(id(obj), None)

    # requests
    def handle(self, body: bytes) -> list[Any]:
        request = self.decoder.decode(body)
        self.release(request[0])
        op, args = request[1], request[2:]
        copyback = None
        if op == "import":
            result = self._import(args[0])
        elif op == "getattr":
            result = getattr(args[0], args[1])
        elif op == "setattr":
            setattr(args[0], args[1], args[2])
            result = None
        elif op in ("call", "callmethod"):
            if op == "callmethod":
                target, name, call_args, call_kwargs, want_copy = args
                target = getattr(target, name)
            else:
                target, call_args, call_kwargs, want_copy = args
            # Which arguments are arrays is told before the call, from what the judge sent: a
            # tensor's __class__ can be reassigned by the call, and an argument that stopped
            # being an array must come back (as what it became), not be left out.
            if want_copy:
                copyback = [[i, a] for i, a in enumerate(call_args) if wire.is_array(a)]
                copyback += [[k, a] for k, a in call_kwargs.items() if wire.is_array(a)]
            result = target(*call_args, **call_kwargs)
        elif op == "len":
            result = len(args[0])
        elif op == "list":
            result = list(args[0])
        elif op == "getitem":
            result = args[0][args[1]]
        elif op == "setitem":
            args[0][args[1]] = args[2]
            result = None
        elif op == "repr":
            result = _short(repr(args[0]))
        elif op == "str":
            result = _short(str(args[0]))
        elif op == "isinstance":
            result = bool(isinstance(args[0], args[1]))
        elif op == "type":
            result = type(args[0])
        elif op == "reset":
            self.objects.clear()
            self.by_identity.clear()
            result = None
        elif op == "ping":
            result = "pong"
        else:
            raise wire.WireError(f"unknown request {op!r}")
        encode = self._to_handle
        return [
            "ok",
            wire.encode_value(result, encode),
            None if copyback is None else wire.encode_value(copyback, encode),
        ]

    def _import(self, name: str) -> Any:
        self._apply_chain()
        return importlib.import_module(name)

    def _apply_chain(self) -> None:
        """With ``--chain``: the learner's earlier labs replace the reference's symbols."""
        if self.chain_applied:
            return
        self.chain_applied = True
        for folder, filename, provides in self.chain:
            name = f"_chain_{Path(folder).name.replace('-', '_')}_{filename[:-3]}"
            spec = importlib.util.spec_from_file_location(name, Path(folder) / filename)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            for ref_module, names in provides.items():
                target = importlib.import_module(ref_module)
                for symbol in names:
                    setattr(target, symbol, getattr(module, symbol))

    def describe(self, exc: BaseException) -> list[Any]:
        """An exception as data: builtin base names (``wire.builtin_exception_names``), type
        name, message, where in the impl."""
        types = wire.builtin_exception_names(exc)
        try:
            message = _short(str(exc), 4000)
        except BaseException:
            message = "<the exception's message could not be read>"
        where = ""
        try:
            frames = [
                f
                for f in traceback.extract_tb(exc.__traceback__)
                if f.filename.startswith(self.impl)
            ]
            if frames:
                where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}"
        except BaseException:
            pass
        return ["err", [types, _short(_type_name(type(exc)), 200), message, where]]


def _type_name(cls: type) -> str:
    try:
        return f"{cls.__module__}.{cls.__qualname__}"
    except BaseException:
        return "<a type without a name>"


def _method_names(cls: type) -> list[str]:
    names = []
    try:
        for name in dir(cls):
            if name.startswith("__"):
                continue
            attr = inspect.getattr_static(cls, name, None)
            if isinstance(attr, staticmethod | classmethod) or inspect.isfunction(attr):
                names.append(name)
    except BaseException:
        return []
    return names


def _short(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 12] + "… (cut)"


def serve(host: Host, fd_in: int, fd_out: int) -> None:
    while True:
        try:
            body = wire.read_frame(fd_in)
        except (EOFError, OSError):
            os._exit(0)
        try:
            reply = host.handle(body)
            frame = wire.pack(reply)
        except BaseException as exc:
            frame = wire.pack(host.describe(exc))
        _write_all(fd_out, frame)


class _RecordingLoader:
    """A module loader that, after its module has run, records the enums it defined
    (``wire.record_enums``); everything else is the wrapped loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        wire.record_enums(module)


class _EnumRecorder:
    """A meta-path finder in front of the others: each ``mini_vllm`` module is found as usual
    and loaded through a :class:`_RecordingLoader`, so that the wire names an enum member as the
    course's only if it is one of the members the course's module made (``wire.GENUINE_ENUMS``),
    recorded before the importer (the submission, say) gets the module and could rebind them."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] != "mini_vllm":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RecordingLoader(spec.loader)
                return spec
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    config = json.loads(sys.argv[1])
    fd_in, fd_out = config["fd_in"], config["fd_out"]
    try:
        enter_sandbox(config)
    except BaseException as exc:
        _write_all(fd_out, wire.pack(["sandbox-failed", f"{type(exc).__name__}: {exc}"]))
        os._exit(70)
    wire.GENUINE_ENUMS = {}
    sys.meta_path.insert(0, _EnumRecorder())
    for module in config.get("preload", []):
        with contextlib.suppress(Exception):  # a missing optional package shows up when used
            importlib.import_module(module)
    _write_all(fd_out, wire.pack(["ready", os.getuid()]))
    serve(Host(config), fd_in, fd_out)


if __name__ == "__main__":
    main()
