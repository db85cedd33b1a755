"""What crosses between judge and learner, and what the grader accepts from the judge.

The judge decodes whatever the learner process sends: the decoder must build only data (or
handles through the judge's own callback), refuse anything else with ``WireError``, and never
fail in another way, whatever the bytes. The grader reads the judge's lines the same way.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grading import protocol, wire
from mini_vllm.request import RequestStatus


def roundtrip(value, to_handle=None, on_handle=None):
    decoder = wire.Decoder(on_handle or (lambda p: ("handle", tuple(p))), lambda m, q, n: (m, q, n))
    return decoder.decode(wire.pack(wire.encode_value(value, to_handle))[4:])


data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers(), max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(data)
def test_data_round_trips_with_its_exact_types(value):
    got = roundtrip(value)
    assert got == value and type(got) is type(value)


def test_arrays_scalars_big_ints_and_sets():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = roundtrip({"a": array, "s": np.int64(7), "big": 2**80, "set": {1, 2}})
    np.testing.assert_array_equal(got["a"], array)
    assert got["a"].dtype == np.float32 and got["a"].flags.writeable
    assert type(got["s"]) is np.int64 and got["s"] == 7
    assert got["big"] == 2**80 and got["set"] == {1, 2}


def test_arrays_keep_their_shape_zero_dimensional_and_strided_included():
    """A 0-d array stays 0-d (``np.ascontiguousarray`` once made it shape (1,), so a learner
    handed one back unchanged was told it had reshaped it), and a transposed view crosses as
    its values."""
    for array in (np.array(5, dtype=np.int32), np.arange(6.0).reshape(2, 3).T, np.zeros((0, 3))):
        got = roundtrip(array)
        assert got.shape == array.shape and got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16):
        got = roundtrip(torch.tensor(3.0, dtype=dtype))
        assert got.shape == () and got.dtype == dtype and float(got) == 3.0


def test_tensors_cross_by_value_bfloat16_included():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        tensor = torch.arange(6).reshape(2, 3).to(dtype)
        got = roundtrip(tensor)
        assert got.dtype == dtype and torch.equal(got, tensor)


def test_enums_cross_by_name():
    assert roundtrip(RequestStatus.RUNNING) == ("mini_vllm.request", "RequestStatus", "RUNNING")


def test_other_objects_need_a_handle():
    class Thing:
        pass

    with pytest.raises(wire.WireError):
        wire.encode_value(Thing(), None)
    assert roundtrip([Thing()], to_handle=lambda obj: [5, 1, "Thing", []]) == [
        ("handle", (5, 1, "Thing", []))
    ]
    with pytest.raises(wire.WireError):
        wire.encode_value(np.array([object()]), None)


def test_nesting_is_bounded_both_ways():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError):
        wire.encode_value(deep, None)
    nested = msgspec.msgpack.Ext(wire.TUPLE, b"\x90")
    for _ in range(wire.MAX_DEPTH + 5):
        nested = msgspec.msgpack.Ext(wire.TUPLE, msgspec.msgpack.encode([nested]))
    with pytest.raises(wire.WireError):
        wire.Decoder(lambda p: p, lambda *a: a).decode(msgspec.msgpack.encode(nested))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_data_or_a_wire_error(raw):
    decoder = wire.Decoder(lambda p: ("handle", p), lambda *a: a)
    with contextlib.suppress(wire.WireError):
        decoder.decode(raw)
    with contextlib.suppress(wire.WireError):
        wire.count_values(raw, 10**6)


def _values_in(value) -> int:
    """The values msgspec builds for ``value`` (extension payloads decoded as messages)."""
    if isinstance(value, list):
        return 1 + sum(_values_in(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_values_in(k) + _values_in(v) for k, v in value.items())
    if isinstance(value, msgspec.msgpack.Ext):
        return 1 + _values_in(_raw_decode(value.data))
    return 1


def _raw_decode(data: bytes):
    return msgspec.msgpack.decode(data, ext_hook=lambda c, d: msgspec.msgpack.Ext(c, bytes(d)))


@settings(max_examples=200, deadline=None)
@given(data | st.lists(data, max_size=3).map(tuple))
def test_the_value_count_is_what_decoding_builds(value):
    body = wire.pack(wire.encode_value(value, None))[4:]
    assert wire.count_values(body, 10**6) == _values_in(_raw_decode(body))


def test_a_message_of_too_many_values_is_refused_before_it_is_decoded(monkeypatch):
    """Bytes do not bound what decoding costs: an empty list is one byte of msgpack and 56 of
    Python. A frame longer than ``MAX_VALUES`` bytes has its values counted first, extension
    payloads included, so that a reply cheap on the wire cannot make the judge build millions
    of objects (tests/hostile/bomb_the_judges_decoder.py is the real-size case)."""
    monkeypatch.setattr(wire, "MAX_VALUES", 1000)
    decoder = wire.Decoder(lambda p: p, lambda *a: a)
    empty_lists = b"\xdd" + (1500).to_bytes(4, "big") + b"\x90" * 1500
    spread = msgspec.msgpack.encode(
        [msgspec.msgpack.Ext(wire.TUPLE, msgspec.msgpack.encode([[]] * 300)) for _ in range(5)]
    )
    for bomb in (empty_lists, spread):
        with pytest.raises(wire.WireError, match="more than 1000 values"):
            decoder.decode(bomb)
    honest = wire.pack(wire.encode_value([b"x" * 5000, np.zeros(4000), *range(900)], None))
    assert len(honest) > 1000 and len(decoder.decode(honest[4:])) == 902
    overrun = msgspec.msgpack.encode([msgspec.msgpack.Ext(wire.TUPLE, b"\xc4\x10"), *[0] * 2000])
    with pytest.raises(wire.WireError, match="malformed"):
        decoder.decode(overrun)


def test_object_arrays_and_unknown_extensions_are_refused():
    decoder = wire.Decoder(lambda p: p, lambda *a: a)
    bad = [
        msgspec.msgpack.Ext(wire.NDARRAY, msgspec.msgpack.encode(["|O", [1], b"\0" * 8])),
        msgspec.msgpack.Ext(99, b"\xc0"),
        msgspec.msgpack.Ext(wire.DICT, msgspec.msgpack.encode([[[1], 2]])),
    ]
    for value in bad:
        with pytest.raises(wire.WireError):
            decoder.decode(msgspec.msgpack.encode(value))


def test_frames_are_length_prefixed_and_bounded():
    read_fd, write_fd = os.pipe()
    wire.write_frame(write_fd, ["ok", [1, 2]])
    assert msgspec.msgpack.decode(wire.read_frame(read_fd)) == ["ok", [1, 2]]
    os.write(write_fd, (wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(wire.WireError):
        wire.read_frame(read_fd)
    os.close(write_fd)
    with pytest.raises(EOFError):
        wire.read_frame(read_fd)
    os.close(read_fd)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"event": "result"}',
        b'{"event": "nope"}',
        b'{"event": "result", "nodeid": 3, "outcome": "passed", "message": "", "duration": 0}',
        b'{"event": "result", "nodeid": "a", "outcome": "passed", "message": "", "duration": true}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"event": "start", "nodeid": "' + b"x" * (5 << 20) + b'"}',
    ],
)
def test_the_grader_drops_malformed_lines(line):
    assert protocol.decode(line) is None


def test_the_grader_accepts_well_formed_lines():
    line = json.dumps(
        {"event": "result", "nodeid": "t", "outcome": "passed", "message": "", "duration": 0.5}
    ).encode()
    assert protocol.decode(line)["nodeid"] == "t"
    assert protocol.decode(protocol.encode("done").strip()) == {"event": "done"}


class Color(enum.Enum):
    RED = 1


def test_unknown_enum_members_reach_the_callback_as_names():
    assert roundtrip(Color.RED)[2] == "RED"


def test_only_an_arrays_contents_come_back_into_the_judge():
    """An array argument comes back as new contents only: one whose type, dtype or shape the
    learner's code changed in place (numpy lets ``a.dtype = "S8"`` reinterpret it) ends the
    test as a fault. Copying it would raise an ordinary ``ValueError`` in the judge, which a
    ``pytest.raises(ValueError)`` around the call would count as the learner's."""
    from grading.remote import LearnerFault, _copy_into

    class Conn:
        def _fail(self, fault):
            return fault

    dest = np.zeros(3, dtype=np.float32)
    _copy_into(Conn(), dest, np.arange(3, dtype=np.float32))
    assert dest.tolist() == [0, 1, 2]
    retyped = np.arange(3, dtype=np.float32).view("S4")
    for changed in (retyped, np.zeros(4, np.float32), np.zeros(3, np.float64), [0, 1, 2]):
        with pytest.raises(LearnerFault, match="changed the type, dtype or shape"):
            _copy_into(Conn(), dest, changed)
    torch = pytest.importorskip("torch")
    cache = torch.zeros(2, dtype=torch.bfloat16)
    _copy_into(Conn(), cache, torch.ones(2, dtype=torch.bfloat16))
    assert cache.tolist() == [1, 1]
    with pytest.raises(LearnerFault, match="changed the type, dtype or shape"):
        _copy_into(Conn(), cache, np.ones(2, np.float32))


def test_a_learner_stop_iteration_is_not_the_judges():
    """A learner's ``StopIteration`` arrives as an error, not as the control-flow exception
    that would silently end a judge-side ``map`` or ``next`` loop; other builtins keep their
    type, so ``pytest.raises(ValueError)`` still sees a learner's ``ValueError``."""
    from grading.remote import LearnerError, _exception_class

    for name in ("StopIteration", "StopAsyncIteration"):
        cls = _exception_class(name)
        assert issubclass(cls, LearnerError) and not issubclass(cls, StopIteration)
        assert not issubclass(cls, StopAsyncIteration)
    assert issubclass(_exception_class("ValueError"), ValueError)


def test_a_learner_object_answers_no_question_only_data_can():
    """``==``, ``in`` and truth on a learner object would run the learner's code (a ``str``
    subclass whose ``__contains__`` hides a character): each raises instead, naming its type,
    and never reaches the learner process (the proxy has no connection here)."""
    from grading.remote import Remote, _TypeInfo

    text = Remote._make(None, 1, _TypeInfo("output_processor._Text", frozenset({"endswith"})))  # type: ignore[arg-type]
    for question in (lambda: text == "a", lambda: "\ufffd" in text, lambda: bool(text)):
        with pytest.raises(TypeError, match=r"output_processor\._Text object where a value"):
            question()
    assert text == text and hash(text) == hash(text)
