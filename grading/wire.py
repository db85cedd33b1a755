"""The values that cross between the judge and the learner process, and how they are framed.

Only data crosses: ``None``, booleans, numbers, strings, bytes, lists, tuples, dicts, sets,
numpy arrays and scalars, torch tensors (by value), enum members (by name), and *handles*: a
number that stands for an object living in the learner process. Decoding builds nothing but
those types, so whatever the learner process sends, the judge never runs its code: no pickle,
no ``__eq__``, no ``__reduce__``. msgspec's msgpack does the byte work (vLLM's own choice for
its engine-core messages); extension codes below say which Python type a payload becomes.

This module is copied into the learner process's sandbox, so it imports only the standard
library, msgspec, and numpy or torch when a value needs them.
"""

from __future__ import annotations

import builtins
import enum
import functools
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import msgspec

TUPLE, DICT, SET, FROZENSET, NDARRAY, TENSOR, HANDLE, BIGINT, ENUM, NPSCALAR, SLICE = range(1, 12)
#: Nesting deeper than this is refused both ways (a learner value nested 10,000 deep is data
#: the judge does not need, and decoding it must not exhaust the stack).
MAX_DEPTH = 48
#: A frame larger than this ends the learner process's session (a 4 GiB length prefix must
#: not make the judge allocate 4 GiB).
MAX_FRAME = 512 * 1024 * 1024
#: A frame of more values than this is refused before it is decoded (about 1 GiB of Python
#: objects at most). Its byte size alone does not bound what decoding costs: an empty list is one
#: byte of msgpack and 64 of Python, so 512 MiB of them would make the judge allocate tens of
#: gigabytes. Arrays and tensors cross as one value each, whatever their size; the largest honest
#: reply of the suites holds 2 million values (lab-05's pool of 333,000 blocks).
MAX_VALUES = 1 << 24
_LEN = struct.Struct("!I")


#: The builtin exception classes, taken when this module is imported (in the learner process,
#: by the host, before any learner code runs): rebinding ``builtins.ValueError`` later changes
#: nothing here.
_BUILTIN_EXCEPTIONS = {
    obj: name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}
#: ``type``'s own ``__mro__`` slot: the method resolution order Python follows, which a
#: metaclass's ``__mro__`` property cannot replace (it can replace ``cls.__mro__``).
_REAL_MRO = type.__dict__["__mro__"]


def builtin_exception_names(exc: BaseException) -> list[str]:
    """The builtin exception classes ``exc`` is an instance of, nearest first, by name: read
    from its type's real method resolution order (the one Python's ``except`` follows) and told
    by identity, never by what a class or a metaclass says of itself
    (tests/hostile/claim_another_exception_type.py,
    tests/hostile/refuse_with_a_class_named_valueerror.py)."""
    mro = _REAL_MRO.__get__(type(exc))
    return [_BUILTIN_EXCEPTIONS[c] for c in mro if c in _BUILTIN_EXCEPTIONS]


def is_array(value: Any) -> bool:
    """A numpy array or a torch tensor, by its real type: what crosses by value, and what the
    host copies back after a call (a class of the learner's can take their names)."""
    kind = type(value)
    return _is_ndarray_type(kind) or _is_tensor_type(kind)


def _is_ndarray_type(kind: type) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and kind is np.ndarray


def _is_tensor_type(kind: type) -> bool:
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and issubclass(kind, torch._C.TensorBase)
        and kind.__module__ == "torch"
        and kind.__name__ in ("Tensor", "Parameter")
    )


class WireError(Exception):
    """A value that cannot cross, or bytes that are not a well-formed message."""


_packer = msgspec.msgpack.Encoder()


def _ext(code: int, payload: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, _packer.encode(payload))


#: In the learner process, the enums of the course's own modules as their import made them
#: (``learner_host`` records each ``mini_vllm`` module's enums right after the module runs,
#: before the submission can rebind or add to them): ``id(class)`` -> (the class, its
#: ``[module, qualname]``, its members by name). None in the judge, whose enums are its own.
GENUINE_ENUMS: dict[int, tuple[type, list[str], dict[str, Any]]] | None = None


def record_enums(module: Any) -> None:
    """Record the enum classes ``module`` defines (see :data:`GENUINE_ENUMS`)."""
    if GENUINE_ENUMS is None:
        return
    name = module.__name__
    for value in list(vars(module).values()):
        if isinstance(value, type) and issubclass(value, enum.Enum) and value.__module__ == name:
            GENUINE_ENUMS[id(value)] = (value, [name, value.__qualname__], dict(value.__members__))


def _enum_names(value: Any, kind: type) -> list[Any]:
    """``[module, qualname, name]`` of an enum member, which the judge turns into its own member
    of that name. In the learner process only a member the course's module made names its
    class: a class's ``__module__`` and ``__qualname__`` are what it says of itself, and an
    ``IntEnum`` of the submission's that called itself ``mini_vllm.request.RequestStatus``, its
    ``FINISHED_LENGTH_CAPPED`` holding FINISHED_STOPPED's value, was judged a length cap while
    every lookup the engine makes took it for a stop
    (tests/hostile/lab_08_name_a_status_it_is_not.py). Any other member goes without a module,
    and the judge keeps it as the string ``qualname.name``."""
    if GENUINE_ENUMS is None:
        return [kind.__module__, kind.__qualname__, value.name]
    entry = GENUINE_ENUMS.get(id(kind))
    if entry is not None and entry[0] is kind:
        for name, member in entry[2].items():
            if member is value:
                return [*entry[1], name]
    return ["", str(getattr(kind, "__qualname__", "?")), str(getattr(value, "_name_", "?"))]


def encode_value(value: Any, to_handle: Callable[[Any], list[Any]] | None, depth: int = 0) -> Any:
    """``value`` as msgpack-ready data; other objects become handles through ``to_handle``."""
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or kind in (bool, float, str, bytes):
        return value
    if kind is int:
        return value if -(2**63) <= value < 2**64 else _ext(BIGINT, str(value))
    if issubclass(kind, enum.Enum):  # its real type: isinstance would take a __class__ claimed
        return _ext(ENUM, _enum_names(value, kind))
    if kind is list:
        return [encode_value(v, to_handle, depth + 1) for v in value]
    if kind is tuple:
        return _ext(TUPLE, [encode_value(v, to_handle, depth + 1) for v in value])
    if kind is dict:
        return _ext(
            DICT,
            [
                [encode_value(k, to_handle, depth + 1), encode_value(v, to_handle, depth + 1)]
                for k, v in value.items()
            ],
        )
    if kind in (set, frozenset):
        return _ext(
            SET if kind is set else FROZENSET,
            [encode_value(v, to_handle, depth + 1) for v in value],
        )
    if kind is bytearray:
        return bytes(value)
    if kind is slice:
        return _ext(
            SLICE,
            [encode_value(v, to_handle, depth + 1) for v in (value.start, value.stop, value.step)],
        )
    # numpy's and torch's values are told by their real types (a class of the learner's can
    # name itself numpy.ndarray, or be a numpy scalar by having dtype and item, and would cross
    # as whatever its own tobytes() says: tests/hostile/reorder_the_counts_behind_numpy_scalars.py).
    # Only numpy's own classes, which no code can change, cross as numpy data.
    if _is_ndarray_type(kind):
        if value.dtype.hasobject:
            raise WireError("numpy arrays of Python objects cannot cross")
        # tobytes() is C order whatever the strides; np.ascontiguousarray would turn a 0-d
        # array into shape (1,).
        return _ext(NDARRAY, [value.dtype.str, list(value.shape), value.tobytes()])
    np = sys.modules.get("numpy")
    if np is not None and kind in _numpy_scalar_types(np):
        if value.dtype.hasobject:
            raise WireError("numpy object scalars cannot cross")
        return _ext(NPSCALAR, [value.dtype.str, value.tobytes()])
    if _is_tensor_type(kind):
        return _ext(TENSOR, _tensor_payload(value))
    if to_handle is None:
        raise WireError(f"a {kind.__name__} cannot be sent to the learner process")
    return _ext(HANDLE, to_handle(value))


@functools.cache
def _numpy_scalar_types(np: Any) -> frozenset[type]:
    """numpy's own scalar classes (``np.int64``, ``np.float32``...): no subclass of them."""
    return frozenset(t for t in np.sctypeDict.values() if isinstance(t, type))


def _tensor_payload(tensor: Any) -> list[Any]:
    """A tensor's values, read with torch's C base methods with torch functions disabled, so a
    subclass's methods and ``__torch_function__`` take no part (a plain tensor comes back)."""
    import torch

    base = torch._C.TensorBase
    with torch._C.DisableTorchFunction():
        cpu = base.contiguous(base.to(base.detach(tensor), "cpu"))
        device = str(base.device.__get__(tensor))
    dtype = str(cpu.dtype).removeprefix("torch.")
    if cpu.dtype == torch.bfloat16:
        raw = cpu.view(torch.int16).numpy().tobytes()
    else:
        raw = cpu.numpy().tobytes()
    return [dtype, list(cpu.shape), raw, device]


def _decode_tensor(payload: list[Any]) -> Any:
    import numpy as np
    import torch

    dtype_name, shape, raw, device = payload
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"unknown tensor dtype {dtype_name!r}")
    if dtype == torch.bfloat16:
        array = np.frombuffer(raw, dtype=np.int16).reshape(shape)
        tensor = torch.from_numpy(array.copy()).view(torch.bfloat16)
    else:
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        tensor = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).reshape(shape).copy())
    device = str(device)
    if device != "cpu" and device.startswith("cuda") and torch.cuda.is_available():
        tensor = tensor.to(device)
    return tensor


class Decoder:
    """msgpack bytes to values; ``on_handle`` and ``on_enum`` say what handles and enums become."""

    def __init__(
        self, on_handle: Callable[[list[Any]], Any], on_enum: Callable[[str, str, str], Any]
    ) -> None:
        self._on_handle = on_handle
        self._on_enum = on_enum
        self._depth = 0
        self._decoder = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)

    def decode(self, data: bytes) -> Any:
        self._depth = 0
        if len(data) > MAX_VALUES:  # a value takes a byte at least: a shorter frame is fine
            count_values(data, MAX_VALUES)
        try:
            return self._decoder.decode(data)
        except WireError:
            raise
        except Exception as exc:  # malformed bytes of any kind: msgspec, numpy, recursion
            raise WireError(f"a malformed message ({type(exc).__name__})") from None

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
            payload = self._decoder.decode(data)
            return self._build(code, payload)
        finally:
            self._depth -= 1

    def _build(self, code: int, payload: Any) -> Any:
        if code == TUPLE:
            return tuple(payload)
        if code == DICT:
            return {_hashable(k): v for k, v in payload}
        if code == SET:
            return {_hashable(v) for v in payload}
        if code == FROZENSET:
            return frozenset(_hashable(v) for v in payload)
        if code == BIGINT:
            return int(payload)
        if code == SLICE:
            return slice(*payload)
        if code == NDARRAY:
            import numpy as np

            dtype_str, shape, raw = payload
            dtype = np.dtype(str(dtype_str))
            if dtype.hasobject:
                raise WireError("numpy arrays of Python objects cannot cross")
            return np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in shape]).copy()
        if code == NPSCALAR:
            import numpy as np

            dtype = np.dtype(str(payload[0]))
            if dtype.hasobject:
                raise WireError("numpy object scalars cannot cross")
            return np.frombuffer(payload[1], dtype=dtype)[0]
        if code == TENSOR:
            return _decode_tensor(payload)
        if code == ENUM:
            module, qualname, name = (str(p) for p in payload)
            return self._on_enum(module, qualname, name)
        if code == HANDLE:
            return self._on_handle(payload)
        raise WireError(f"unknown extension code {code}")


#: msgpack type bytes by what follows them: a fixed number of data bytes; a length of so many
#: bytes, then that many data bytes (str, bin); a length, then items (array, map); a length, a
#: type byte and a payload (ext); a type byte and a payload of a fixed size (fixext).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED.update({0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8})
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_HEADERS = {0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def count_values(data: bytes | memoryview, stop_after: int) -> int:
    """How many values ``data`` holds, extension payloads included; ``WireError`` past
    ``stop_after``, or if the bytes are not msgpack.

    A walk over the type bytes only (strings and bins, arrays' included, are skipped whole), so
    it costs one step per value and stops at the first one past the limit. Each extension
    payload is walked as the message it is and must end where its length says, so bytes cannot
    be counted as one thing and decoded as another."""
    view = memoryview(data).cast("B")
    count, pos, ends = 0, 0, [len(view)]
    try:
        while True:
            while pos == ends[-1]:
                ends.pop()
                if not ends:
                    return count
            if pos > ends[-1]:
                raise WireError("a malformed message (a value overruns its extension)")
            count += 1
            if count > stop_after:
                raise WireError(f"a message of more than {stop_after} values")
            byte = view[pos]
            pos += 1
            if 0xA0 <= byte <= 0xBF:  # fixstr
                pos += byte - 0xA0
            elif byte <= 0x9F or byte >= 0xE0:  # fixint, fixmap, fixarray: items follow inline
                pass
            elif byte in _FIXED:
                pos += _FIXED[byte]
            elif byte in _FIXEXT:
                ends.append(pos + 1 + _FIXEXT[byte])
                pos += 1
            else:
                width = _SIZED.get(byte) or _HEADERS.get(byte) or _EXT.get(byte)
                if width is None:
                    raise WireError(f"a malformed message (type byte {byte:#x})")
                size = int.from_bytes(view[pos : pos + width], "big")
                pos += width
                if byte in _SIZED:
                    pos += size
                elif byte in _EXT:
                    ends.append(pos + 1 + size)
                    pos += 1
            if len(ends) > MAX_DEPTH + 2:
                raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    except IndexError:
        raise WireError("a malformed message (truncated)") from None


def _hashable(value: Any) -> Any:
    if isinstance(value, list | dict | set):
        raise WireError("an unhashable key in a dict or set")
    return value


def pack(message: Any) -> bytes:
    """One frame: a 4-byte length, then the msgpack body."""
    body = _packer.encode(message)
    if len(body) > MAX_FRAME:
        raise WireError(f"a message of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


def write_frame(fd: int, message: Any) -> None:
    data = memoryview(pack(message))
    while data:
        data = data[os.write(fd, data) :]


def read_exact(fd: int, n: int, wait: Callable[[], None] | None = None) -> bytes:
    """Read ``n`` bytes; ``wait`` (if given) is called before each read and may raise."""
    chunks, got = [], 0
    while got < n:
        if wait is not None:
            wait()
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, wait: Callable[[], None] | None = None) -> bytes:
    (length,) = _LEN.unpack(read_exact(fd, _LEN.size, wait))
    if length > MAX_FRAME:
        raise WireError(f"a frame of {length} bytes is over the {MAX_FRAME}-byte limit")
    return read_exact(fd, length, wait)
