"""Leaves a child process behind that would write a forged results file after the grade."""
import json
import os
import subprocess
import sys

_target = os.environ.get("HOSTILE_RESULTS_TARGET")
if _target:
    code = ("import json, time; time.sleep(4); "
            f"open({_target!r}, 'w').write(json.dumps({{'score': 999}}))")
    subprocess.Popen([sys.executable, "-c", code])


class KVCacheBlock:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("lab-01: nothing written")


FreeKVCacheBlockQueue = BlockPool = KVCacheBlock
