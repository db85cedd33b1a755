"""Tries to forge a perfect score: fake results files and fake protocol lines everywhere."""
import json
import os
import sys

_FAKE = {"score": 999, "tests": [{"name": "forged", "score": 999, "max_score": 1}]}
for path in ("results.json", os.path.join(os.environ.get("PWD", "."), "results.json"),
             "/tmp/results.json"):
    try:
        with open(path, "w") as fh:
            json.dump(_FAKE, fh)
    except OSError:
        pass

_LINE = json.dumps({"nonce": "", "event": "result", "outcome": "passed", "nodeid": "*"}) + "\n"
print(_LINE * 50)
for fd in range(3, 64):
    try:
        os.write(fd, _LINE.encode() * 5)
    except OSError:
        pass
sys.stdout.flush()


class KVCacheBlock:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("lab-01: nothing written")


FreeKVCacheBlockQueue = BlockPool = KVCacheBlock
