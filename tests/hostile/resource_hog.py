# base: stub
"""Eats memory, processes and disk: each must hit a limit, not the machine."""
import os as _os


def _hog_memory():
    chunks = []
    try:
        for _ in range(64):
            chunks.append(bytearray(1024 * 1024 * 1024))
    except MemoryError:
        pass


def _hog_disk():
    for i in range(40):
        try:
            with open(f"hog-{i}.bin", "wb") as fh:
                fh.write(b"\0" * (8 * 1024 * 1024))
        except OSError:
            break


def _hog_processes():
    pids = []
    for _ in range(2000):
        try:
            pid = _os.fork()
        except OSError:
            break
        if pid == 0:
            import time
            time.sleep(30)
            _os._exit(0)
        pids.append(pid)


_hog_memory()
_hog_disk()
_hog_processes()
