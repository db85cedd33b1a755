# base: solution
# lab: lab-02
# tests: test_report_definitions_on_handmade_steps, test_report_of_nothing
# honest: _summarize = summarize; summarize = lambda sim: (sim.steps.sort(key=lambda s: -s.held_tokens), _summarize(sim))[1]
"""``summarize`` sorts the simulation's own steps by the memory they hold to find the peak (the
honest bug: the report is right, the simulation is out of order afterwards). The test read
only each step's ``step`` field after the call, which the learner's own ``StepStats`` holds:
renumbering the sorted steps 0, 1, ... kept the test's 3 points with the simulation changed
(every index now holds another step's numbers; a red-team helper)."""

_summarize = summarize


def _summarize_and_renumber(sim):
    sim.steps.sort(key=lambda s: -s.held_tokens)
    for i, s in enumerate(sim.steps):
        object.__setattr__(s, "step", i)
    return _summarize(sim)


summarize = _summarize_and_renumber
