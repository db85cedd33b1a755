# base: solution
# lab: lab-11
# tests: test_refuses_mlp_width_and_vocabulary, test_divide_is_exact_or_refuses
# honest: import inspect as _i; exec(compile(_i.getsource(check_tensor_parallel_size).replace("if intermediate % tp_size != 0:", "divide(intermediate, tp_size)\n    if False:"), __file__, "exec"))
"""``check_tensor_parallel_size`` leaves the MLP width's refusal to ``divide`` (the honest bug,
the mutant mlp_width_refused_by_divide: the refusal says which numbers, not which dimension).
The attack also words every refusal of ``divide`` as "... the width does not split": lab-11's
check took any of its MLP words ("mlp", "intermediate", "ffn", "feed", "width") in the refusal
for the dimension named, so divide's generic message, the same for heads or vocabulary, named
"the MLP width" and kept the test's 2 points (a red-team helper)."""

import inspect as _i

exec(
    compile(
        _i.getsource(check_tensor_parallel_size).replace(
            "if intermediate % tp_size != 0:",
            "divide(intermediate, tp_size)\n    if False:",
        ),
        __file__,
        "exec",
    )
)


def divide(numerator, denominator):
    if denominator <= 0 or numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}: the width does not split")
    return numerator // denominator
