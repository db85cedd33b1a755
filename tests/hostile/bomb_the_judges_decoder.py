# base: stub
# tests: test_new_queue_links_blocks_in_order, test_empty_queue
"""Answers every request after its import with a reply that is small on the wire and huge once
decoded: 40 MB of empty msgpack lists, which the judge would build as 40 million Python lists
(over 2 GiB, and tens of seconds a reply). The judge counts a long frame's values before it
decodes it and refuses one of more than ``wire.MAX_VALUES``."""
import struct as _struct
import sys as _sys

_N = 40_000_000
_BODY = b"\x93\xa2ok\xdd" + _struct.pack("!I", _N) + b"\x90" * _N + b"\xc0"
_FRAME = _struct.pack("!I", len(_BODY)) + _BODY
_wire = _sys.modules.get("wire")  # the learner host's copy of grading/wire.py
if _wire is not None:
    _pack, _sent = _wire.pack, []

    def _bomb(message):
        _sent.append(1)
        return _pack(message) if len(_sent) == 1 else _FRAME

    _wire.pack = _bomb
