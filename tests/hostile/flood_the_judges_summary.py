# base: solution
# lab: lab-03
# tests: test_available_kv_cache_memory, test_num_gpu_blocks_from_budget_floors
# honest: _g = available_kv_cache_memory; available_kv_cache_memory = lambda t, u, n: "x" if u == 0.1 else _g(t, u, n)
"""Wrong for one call, where it returns a 12 MB string that the test's failure message quotes.
The judge's output is capped at 8 MiB and pytest used to print every failure's message again
at the end of its session: the judge was killed there, after its last result, and the grader,
finding no test in flight to blame, crashed without writing results.json. The judge now prints
no failure reports (its results go over the pipe), and a judge that dies with every test
recorded costs nothing."""

_g = available_kv_cache_memory


def available_kv_cache_memory(total_gpu_memory, gpu_memory_utilization, non_kv_memory):
    if gpu_memory_utilization == 0.1:
        return "x" * 12_000_000
    return _g(total_gpu_memory, gpu_memory_utilization, non_kv_memory)
