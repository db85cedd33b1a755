"""The judge's side of the learner process: proxies that look like the learner's objects.

A graded test calls ``load_impl("block_pool")`` and gets a :class:`Remote` standing for the
learner's module. Everything done with it (reading an attribute, calling a method, ``len``,
iterating, indexing) is one request to the learner process; what comes back is plain data
(ints, lists, numpy arrays, tensors…) or another :class:`Remote`. So test code reads almost as
if the learner's objects were local, while:

* no learner code ever runs in the judge: equality, hashing and truth of a :class:`Remote` are
  the judge's own (identity), and results are data built by the judge's decoder;
* a learner exception raised by a call arrives as a :class:`LearnerError` that is also an
  instance of the same builtin type (``pytest.raises(ValueError)`` works), with the learner's
  message; one raised while the judge reads an object has no builtin type
  (:class:`LearnerReadError`), so that no suite takes it for the call's refusal;
* a hang, a crash or a ``BaseException`` in learner code raises a :class:`LearnerFault`, which
  is not an ``Exception``: no ``pytest.raises(Exception)`` can swallow it, and it ends the test.

Arrays and tensors passed as arguments are copied in and, after the call, copied back into the
judge's objects, so in-place kernels (``reshape_and_cache``) behave as they would locally.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import inspect
import os
import select
import signal
import sys
import time
import weakref
from typing import Any

from grading import wire
from grading.sandbox import Launched, Staging, launch

_START_TIMEOUT = 60.0


class LearnerFault(BaseException):
    """The learner process misbehaved in a way no test may catch: it ends the test."""

    outcome = "error"


class LearnerTimeout(LearnerFault):
    outcome = "timeout"


class LearnerCrashed(LearnerFault):
    outcome = "crashed"


class LearnerAborted(LearnerFault):
    """Learner code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``…)."""


class LearnerNotStarted(BaseException):
    """Learner code raised ``NotImplementedError``: a task not written yet, NOT STARTED.

    A ``BaseException`` in the judge, so that nothing between the learner and the reporter
    catches it: not a test's ``except Exception``, and not Hypothesis, which would take it for a
    failure and shrink it, calling the stub again for seconds (16 s of lab-10's 20 s timeout).
    """


class LearnerError(Exception):
    """An exception raised by learner code, as data: its type name, message and location, and
    ``request``, the operation whose answer it was (``call`` or ``callmethod`` for a call;
    ``getattr``, ``getitem``, ``list``... for reading an attribute, an item, an iteration).
    """

    learner_type: str = ""
    where: str = ""
    request: str = ""


class LearnerReadError(LearnerError):
    """An exception the learner's code raised while the judge *read* one of its objects (an
    attribute, an item, a length, its items, its text), of no builtin type.

    A suite grades a refusal by the exception a call raises: ``pytest.raises(ValueError)``,
    ``except IndexError`` or ``assert_value_error`` around the function under test. If reading
    an argument or a result inside that region could raise a ``ValueError``, an object whose
    attribute raises would pass for the function refusing its input. Mirrored as a bare
    ``LearnerError``, an exception of a read matches no builtin ``except`` clause anywhere in a
    suite, whatever the suite's author wrote: it fails the test, showing the learner's type
    and message. Two answers keep their type: an ``AttributeError`` of ``getattr``, which
    ``hasattr`` and ``getattr(obj, name, default)`` are built on, and the control-flow
    exceptions, already mirrored without their type (``_CONTROL_FLOW``).
    """


#: The requests whose exception is the learner's answer, kept with its builtin type: a call (a
#: function refusing its input), a write (a setter refusing its value: lab-05's ``block_hash``
#: set twice) and an import (a module that fails to load).
_ANSWERING_REQUESTS = frozenset({"call", "callmethod", "setattr", "setitem", "import"})


def _as_answer_to(op: str, exc: LearnerError) -> LearnerError:
    """``exc`` as the judge sees it after request ``op``: a read's exception loses its builtin
    type (:class:`LearnerReadError`), but for ``getattr``'s ``AttributeError``."""
    if op in _ANSWERING_REQUESTS or (op == "getattr" and isinstance(exc, AttributeError)):
        return exc
    read = LearnerReadError(*exc.args)
    read.learner_type, read.where = exc.learner_type, exc.where
    read.display = getattr(exc, "display", str(exc))  # type: ignore[attr-defined]
    return read


_classes: dict[str, type[LearnerError]] = {}


#: Exceptions that steer the judge's own control flow rather than report an error: a learner's
#: ``StopIteration`` mirrored as one would silently end a judge-side ``map`` or ``next`` loop.
_CONTROL_FLOW = frozenset({"StopIteration", "StopAsyncIteration"})


def _exception_class(builtin_name: str) -> type[LearnerError]:
    """``LearnerError`` mixed with the builtin exception the learner's one derives from."""
    cls = _classes.get(builtin_name)
    if cls is None:
        base = getattr(builtins, builtin_name, None)
        bases: tuple[type, ...] = (LearnerError,)
        if builtin_name in _CONTROL_FLOW:
            base = None
        if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
            bases = (LearnerError, base)
        try:
            cls = type(f"Learner{builtin_name}", bases, {})
        except TypeError:  # an incompatible layout (a few OSError subclasses)
            cls = type(f"Learner{builtin_name}", (LearnerError,), {})
        _classes[builtin_name] = cls
    return cls


def _instantiate(types: list[str], message: str) -> LearnerError:
    """The judge's twin of the learner's exception, from the nearest builtin base whose
    constructor takes one message: ``UnicodeDecodeError`` wants five arguments, so a learner's
    one arrives as a ``UnicodeError`` (still a ``ValueError``), an ``ExceptionGroup`` as an
    ``Exception``."""
    for name in types:
        try:
            return _exception_class(name)(message)
        except TypeError:
            continue
    return LearnerError(message)


class _TypeInfo:
    __slots__ = ("methods", "name")

    def __init__(self, name: str, methods: frozenset[str]) -> None:
        self.name, self.methods = name, methods


class Connection:
    """One learner process, and the requests the judge makes of it."""

    def __init__(self, staging: Staging, gpu: bool = False, preload: tuple[str, ...] = ()) -> None:
        self.launched: Launched = launch(staging, gpu=gpu, preload=preload)
        self.proxies: weakref.WeakValueDictionary[int, Remote] = weakref.WeakValueDictionary()
        self.types: dict[int, _TypeInfo] = {}
        self.released: list[int] = []
        self.dead: LearnerFault | None = None
        self.tainted = False
        self.deadline: float | None = None
        self.decoder = wire.Decoder(self._on_handle, _judge_enum)
        self._hello()

    # -- process ---------------------------------------------------------------------------
    def _hello(self) -> None:
        self.deadline = time.monotonic() + _START_TIMEOUT
        try:
            reply = self._receive()
        finally:
            self.deadline = None
        if not (isinstance(reply, list) and reply and reply[0] == "ready"):
            detail = reply[1] if isinstance(reply, list) and len(reply) > 1 else reply
            self.close()
            raise RuntimeError(f"the learner sandbox did not start: {str(detail)[:500]}")

    def close(self) -> None:
        self.launched.kill()
        if self.dead is None:
            self.dead = LearnerCrashed("the learner process was stopped")

    def exit_text(self) -> str:
        code = self.launched.proc.poll()
        if code is None:
            return "no exit status"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        if code == 128 + 9 or code == 137:
            return "killed by SIGKILL"
        return f"exit status {code}"

    def _fail(self, fault: LearnerFault) -> LearnerFault:
        self.dead = fault
        self.tainted = True
        self.launched.kill()
        return fault

    def _wait_readable(self, fd: int) -> None:
        while True:
            timeout = None if self.deadline is None else self.deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise self._fail(LearnerTimeout("the learner's code did not return in time"))
            ready, _, _ = select.select([fd], [], [], timeout)
            if ready:
                return

    def _send(self, frame: bytes) -> None:
        view = memoryview(frame)
        fd = self.launched.to_learner
        while view:
            timeout = None if self.deadline is None else self.deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise self._fail(LearnerTimeout("the learner's code did not return in time"))
            _, ready, _ = select.select([], [fd], [], timeout)
            if ready:
                try:
                    view = view[os.write(fd, view[:65536]) :]
                except OSError:
                    raise self._crashed() from None

    def _crashed(self) -> LearnerFault:
        with contextlib.suppress(Exception):
            self.launched.proc.wait(timeout=2)
        tail = self.launched.log_tail(600).strip()
        message = f"the learner process died ({self.exit_text()})"
        if tail:
            message += f"; its last output:\n{tail}"
        return self._fail(LearnerCrashed(message))

    def _receive(self) -> Any:
        fd = self.launched.from_learner
        try:
            body = wire.read_frame(fd, lambda: self._wait_readable(fd))
        except (EOFError, OSError):
            raise self._crashed() from None
        except wire.WireError as exc:
            raise self._fail(
                LearnerFault(f"the learner process broke the protocol: {exc}")
            ) from None
        try:
            return self.decoder.decode(body)
        except wire.WireError as exc:
            raise self._fail(LearnerFault(f"the learner process sent {exc}")) from None

    # -- requests --------------------------------------------------------------------------
    def request(self, op: str, *args: Any) -> Any:
        value, _ = self.request_with_copyback(op, *args)
        return value

    def request_with_copyback(self, op: str, *args: Any) -> tuple[Any, Any]:
        if self.dead is not None:
            raise type(self.dead)(*self.dead.args)
        released, self.released = self.released, []
        try:
            encoded = [released, op, *[wire.encode_value(a, _to_wire) for a in args]]
            frame = wire.pack(encoded)
        except wire.WireError as exc:
            raise TypeError(f"the judge cannot send this to the learner: {exc}") from None
        self._send(frame)
        reply = self._receive()
        if not isinstance(reply, list) or len(reply) < 2 or not isinstance(reply[0], str):
            raise self._fail(LearnerFault("the learner process sent a reply of the wrong shape"))
        if reply[0] == "ok":
            return reply[1], (reply[2] if len(reply) > 2 else None)
        if reply[0] == "err" and isinstance(reply[1], list) and len(reply[1]) == 4:
            exc = self._exception(reply[1])
            if isinstance(exc, LearnerError):
                exc = _as_answer_to(op, exc)
                exc.request = op
            raise exc
        raise self._fail(LearnerFault("the learner process sent a reply of the wrong shape"))

    def _exception(self, info: list[Any]) -> BaseException:
        types, name, message, where = (x if isinstance(x, str | list) else "" for x in info)
        types = [t for t in types if isinstance(t, str)] if isinstance(types, list) else []
        name, message, where = str(name)[:200], str(message)[:4000], str(where)[:300]
        first = types[0] if types else "Exception"
        base = getattr(builtins, first, None)
        short = name.rsplit(".", 1)[-1]
        text = f"{short}: {message}" if message else short
        if where:
            text += f"\n  at {where}"
        if not (isinstance(base, type) and issubclass(base, Exception)):
            self.tainted = True
            return LearnerAborted(
                f"your code raised {text} (it ends a program, not an "
                "operation; raise an Exception subclass)"
            )
        if first == "NotImplementedError":
            return LearnerNotStarted(message)
        exc = _instantiate([*types, "Exception"], message)
        exc.learner_type, exc.where = name, where
        exc.args = (message,)
        exc.display = text  # type: ignore[attr-defined]
        return exc

    def _on_handle(self, payload: Any) -> Remote:
        if not isinstance(payload, list) or len(payload) != 4:
            raise wire.WireError("a malformed handle")
        hid, type_id, type_name, methods = payload
        if not isinstance(hid, int) or not isinstance(type_id, int):
            raise wire.WireError("a malformed handle")
        if type_id not in self.types:
            names = frozenset(m for m in methods or [] if isinstance(m, str))
            self.types[type_id] = _TypeInfo(str(type_name)[:200], names)
        proxy = self.proxies.get(hid)
        if proxy is None:
            proxy = Remote._make(self, hid, self.types[type_id])
            self.proxies[hid] = proxy
        return proxy


def _to_wire(obj: Any) -> list[Any]:
    if isinstance(obj, Remote):
        return [object.__getattribute__(obj, "_hid"), 0, "", None]
    if isinstance(obj, _RemoteMethod):
        raise wire.WireError("pass the object, not one of its methods")
    raise wire.WireError(
        f"a judge-side {type(obj).__name__}: build it in the learner process "
        "(learner_module(...)) and pass that"
    )


def _judge_enum(module: str, qualname: str, name: str) -> Any:
    """An enum member from the learner becomes the judge's own member, if the judge has it.

    The names are the learner's data, so they only ever *name* an enum: the module must be one
    of the reference's, already imported here (nothing is imported on the learner's say), the
    class must be an ``Enum`` defined in that module under that very name (no walking through
    attributes to another module's objects, ``os.environ`` say), and the member is read from
    its members. Anything else stays a string.
    """
    fallback = f"{qualname}.{name}"
    if module.split(".")[0] != "mini_vllm":
        return fallback
    target: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if target is None or not part.isidentifier() or part.startswith("_"):
            return fallback
        target = inspect.getattr_static(target, part, None)
        if not isinstance(target, type):
            return fallback
    if not (
        isinstance(target, type)
        and issubclass(target, enum.Enum)
        and target.__module__ == module
        and target.__qualname__ == qualname
    ):
        return fallback
    return target.__members__.get(name, fallback)


class Writes:
    """An array or tensor argument that a call may write into: an in-place kernel's output
    (``writes(key_cache)``).

    Arrays and tensors cross by value, so a learner function that writes in place writes into
    its process's copy; after the call the copies come back. Only the arguments marked so are
    written into the judge's own arrays. Every other array argument must come back as it went:
    one the call changed fails the test, and the judge's array keeps what the judge put there.
    So an expectation computed later from an array the test passed reads the judge's data,
    never what the learner's code left in it, whatever the suite does with its arrays
    (tests/hostile/shorten_the_sequences_the_oracle_reads.py)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        if not wire.is_array(array):
            raise TypeError(f"writes() marks a numpy array or a torch tensor, not {array!r:.60}")
        self.array = array


def writes(array: Any) -> Writes:
    """Mark ``array`` as an output the learner's call may write into (see :class:`Writes`)."""
    return Writes(array)


class LearnerWroteAnInput(AssertionError):
    """The learner's call changed an array argument that is not one of its outputs."""


def _check_unchanged(conn: Connection, key: int | str, dest: Any, src: Any) -> None:
    """An array argument that is no output came back as it went, or the test fails; the
    judge's array is left as it was in either case."""
    _check_same_kind(conn, dest, src)
    if _contents(dest) != _contents(src):
        what = f"argument {key + 1}" if isinstance(key, int) else f"argument {key}"
        raise LearnerWroteAnInput(
            f"your code changed its {what}, a {_array_text(dest)} it must only read: write "
            "only into what you return (or, for an in-place function, into its outputs)"
        )


def _contents(value: Any) -> bytes:
    """An array's or a tensor's values as bytes (NaN equal to itself, ``-0.0`` not to ``0.0``)."""
    if type(value).__module__ == "numpy":
        return value.tobytes()
    import torch

    raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return bytes(raw.numpy().tobytes())


def _check_same_kind(conn: Connection, dest: Any, src: Any) -> None:
    """Only contents cross back: an array whose type, dtype or shape the learner's code changed
    in place (``a.dtype = ...``, ``a.resize(...)``) ends the test as a fault, so that a failed
    copy never raises an ordinary exception in the judge, where a ``pytest.raises`` around the
    call would take it for the learner's."""
    same = wire.is_array(src) and type(src).__module__ == type(dest).__module__
    if not (same and src.dtype == dest.dtype and tuple(src.shape) == tuple(dest.shape)):
        raise conn._fail(
            LearnerFault(
                "your code changed the type, dtype or shape of an array it was given "
                f"(a {_array_text(dest)} came back as a {_array_text(src)}): write into the "
                "array, do not reshape or re-type it in place"
            )
        )


def _copy_into(conn: Connection, dest: Any, src: Any) -> None:
    """An output argument's new contents, written into the judge's own array."""
    _check_same_kind(conn, dest, src)
    if type(dest).__module__ == "numpy":
        dest[...] = src
    else:
        dest.copy_(src.to(dest.device))


def _array_text(value: Any) -> str:
    if not wire.is_array(value):
        return type(value).__name__
    return f"{type(value).__name__} of {value.dtype} {tuple(value.shape)}"


def _unmarked(value: Any) -> Any:
    return value.array if isinstance(value, Writes) else value


def _call(
    conn: Connection, op: str, head: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    outputs = {i for i, a in enumerate(args) if isinstance(a, Writes)}
    outputs |= {k for k, v in kwargs.items() if isinstance(v, Writes)}
    args = tuple(_unmarked(a) for a in args)
    kwargs = {k: _unmarked(v) for k, v in kwargs.items()}
    arrays = any(wire.is_array(a) for a in args) or any(wire.is_array(v) for v in kwargs.values())
    value, copyback = conn.request_with_copyback(op, *head, list(args), dict(kwargs), arrays)
    if arrays and isinstance(copyback, list):
        for entry in copyback:
            if not (isinstance(entry, list) and len(entry) == 2):
                continue
            key, new = entry
            if isinstance(key, int) and 0 <= key < len(args) and wire.is_array(args[key]):
                dest = args[key]
            elif isinstance(key, str) and wire.is_array(kwargs.get(key)):
                dest = kwargs[key]
            else:
                continue
            if key in outputs:
                _copy_into(conn, dest, new)
            else:
                _check_unchanged(conn, key, dest, new)
    return value


class _RemoteMethod:
    """``obj.method`` for a method the learner's class defines: calling it is one request."""

    __slots__ = ("_name", "_owner")

    def __init__(self, owner: Remote, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        conn = object.__getattribute__(owner, "_conn")
        return _call(conn, "callmethod", [owner, self._name], args, kwargs)

    def __repr__(self) -> str:
        return f"<learner method {self._name}>"

    # A name the learner's class lists among its methods can be an instance attribute that
    # hides one, so a suite expecting a value may hold a method: like a Remote, it is no value.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, _RemoteMethod):
            return self is other
        raise self._not_a_value(f"compared with {type(other).__name__} {str(other)[:60]}")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __bool__(self) -> bool:
        raise self._not_a_value("asked whether it is true")

    def _not_a_value(self, what: str) -> TypeError:
        return TypeError(
            f"your code gave its method {self._name} where a value was expected (it was {what}); "
            "an attribute must not share its name with a method of its class"
        )


def _compared(obj: Remote, other: object) -> TypeError:
    """Data compared with a learner object: the learner returned an object where a value (an
    int, a list…) was expected. Saying so beats ``==`` quietly being False (or ``!=`` True)."""
    name = object.__getattribute__(obj, "_type").name
    return TypeError(
        f"your code gave a {name} object where a value was expected (it was "
        f"compared with {type(other).__name__} {str(other)[:60]})"
    )


def _asked(obj: Remote, question: str) -> TypeError:
    """A question only data can answer, put to a learner object: its answer would be learner
    code's to give (``in``, truth), so the object is refused as a value instead."""
    name = object.__getattribute__(obj, "_type").name
    return TypeError(
        f"your code gave a {name} object where a value was expected (the test asked "
        f"{question}): return builtin data (a list, a dict, a str ...), not an object of your "
        "own class"
    )


class Remote:
    """An object that lives in the learner process. Equality, hash and ``is`` are identity;
    comparing one with data (``== 3``, ``!= [1]``), asking it ``x in obj`` or its truth raises
    ``TypeError``: those answers would be the learner's code to give, and a suite that wants
    them reads plain data (an attribute's dict, a list) instead.

    Handles are never released during a test (a proxy that dies and a handle that comes back
    in the same reply must not race); the learner process drops them all when the test ends.
    """

    __slots__ = ("__weakref__", "_conn", "_hid", "_type")

    @classmethod
    def _make(cls, conn: Connection, hid: int, info: _TypeInfo) -> Remote:
        obj = object.__new__(cls)
        object.__setattr__(obj, "_conn", conn)
        object.__setattr__(obj, "_hid", hid)
        object.__setattr__(obj, "_type", info)
        return obj

    def _req(self, op: str, *args: Any) -> Any:
        return object.__getattribute__(self, "_conn").request(op, self, *args)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        info = object.__getattribute__(self, "_type")
        if name in info.methods:
            return _RemoteMethod(self, name)
        return self._req("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._req("setattr", name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(object.__getattribute__(self, "_conn"), "call", [self], args, kwargs)

    def __len__(self) -> int:
        n = self._req("len")
        if type(n) is not int or n < 0:
            raise TypeError("len() of a learner object did not give a count")
        return n

    def __iter__(self) -> Any:
        items = self._req("list")
        if type(items) is not list:
            raise TypeError("iterating a learner object did not give a list")
        return iter(items)

    def __getitem__(self, key: Any) -> Any:
        return self._req("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._req("setitem", key, value)

    def __contains__(self, item: Any) -> bool:
        raise _asked(self, f"whether it holds {item!r}"[:80])

    def __bool__(self) -> bool:
        raise _asked(self, "whether it is true")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Remote):
            return self is other
        raise _compared(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, Remote):
            return self is not other
        raise _compared(self, other)

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __repr__(self) -> str:
        info = object.__getattribute__(self, "_type")
        try:
            text = self._req("repr")
        except (LearnerError, TypeError):
            text = None
        return str(text)[:300] if isinstance(text, str) else f"<learner {info.name}>"

    def __str__(self) -> str:
        return self.__repr__()


def type_name(obj: Any) -> str:
    """The learner-side type of a value: ``module.Qualname`` for a :class:`Remote`."""
    if isinstance(obj, Remote):
        return object.__getattribute__(obj, "_type").name
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def remote_isinstance(obj: Any, cls: Any) -> bool:
    """``isinstance`` evaluated in the learner process (``cls`` a :class:`Remote` class)."""
    if not isinstance(obj, Remote):
        return False
    return obj._req("isinstance", cls) is True
