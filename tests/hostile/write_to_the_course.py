# base: stub
"""Rewrites the suite, the grader and drops a sitecustomize.py wherever it can write."""
import os as _os
import site as _site
import sys as _sys

_PAYLOAD = "def test_forged():\n    pass\n"
_roots = ["/work/main", "/autograder/source/course", _os.getcwd()]
for _root in _roots:
    for _rel in ("tests/labs/lab_01/test_free_queue.py", "tests/labs/lab_01/test_block_pool.py",
                 "grading/child.py", "grading/report.py", "rich.py", "sitecustomize.py"):
        try:
            with open(_os.path.join(_root, _rel), "a") as _fh:
                _fh.write("\n# hostile\n")
        except OSError:
            pass
for _dir in [*_site.getsitepackages(), *_sys.path]:
    try:
        with open(_os.path.join(_dir, "sitecustomize.py"), "w") as _fh:
            _fh.write("import os\nos.environ['HOSTILE'] = '1'\n")
    except OSError:
        pass
