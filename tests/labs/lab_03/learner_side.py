"""lab-03's helpers in the learner process: they build the configs that the learner's
``kv_cache_dims`` reads, and never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. A config is not
data that can cross between the processes, so the judge sends the fields (plain data) and the
config object is built here, where the learner's function receives it. Every number the
verdict depends on comes back to the judge as plain data and is checked there.
"""

from __future__ import annotations

import os
from typing import Any


def config(**fields: Any) -> Any:
    """A config as transformers spells it, with exactly ``fields`` as attributes (an omitted
    attribute is absent, as in older config files)."""
    from types import SimpleNamespace

    return SimpleNamespace(**fields)


def hf_config(fields: dict[str, Any]) -> Any:
    """The transformers config of a checkpoint, loaded the way the engine loads it.

    ``fields`` is the checkpoint's ``config.json`` as the judge read it; it is saved in this
    process's private temporary folder (the judge's files are not visible here) and read back
    with ``AutoConfig.from_pretrained``, so the learner's code gets the very object type the
    engine reads its shape from.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The sandbox's uid has no passwd entry and its environment no USER: where transformers
    # pulls in torch._dynamo (through torchvision), torch names its cache folder after
    # getpass.getuser(), which then raises KeyError. A name for it avoids the lookup.
    os.environ.setdefault("USER", "learner")
    import json
    import tempfile

    from transformers import AutoConfig

    folder = tempfile.mkdtemp(prefix="lab03_config_")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(fields, f)
    return AutoConfig.from_pretrained(folder, local_files_only=True)
