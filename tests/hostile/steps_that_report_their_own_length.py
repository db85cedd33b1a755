# base: solution
# lab: lab-02
# tests: test_arrivals_and_idle_steps, test_worked_example_paged
# honest: import inspect as _i; exec(_i.getsource(simulate).replace("while pending or waiting or running:", "while pending or waiting or running or step == 0:"))
"""``simulate`` always runs step 0 (the honest bug: an empty trace gets one idle step, where
the README says it has none). The suite read the number of steps as ``len(sim.steps)``, which
for a learner object is the object's own ``__len__``: a ``list`` subclass that answers 0 kept
test_arrivals_and_idle_steps' point with the idle step in place (49/49 for an honest 48/49;
a red-team helper)."""

import inspect as _i

exec(
    _i.getsource(simulate).replace(
        "while pending or waiting or running:",
        "while pending or waiting or running or step == 0:",
    )
)
_simulate = simulate


class _Steps(list):
    def __len__(self) -> int:
        return 0


def simulate(trace, allocator, max_model_len=None):
    trace = list(trace)
    sim = _simulate(trace, allocator, max_model_len)
    if not trace:
        sim.steps = _Steps(sim.steps)
    return sim
